"""The task author's API, implemented here and exported by the ``perago`` façade alone.

Task modules import from ``perago``; these modules are the runtime's to rearrange (as
temporalio keeps ``_activity.py`` behind ``temporalio.worker``). Nothing is imported here, so
``import perago`` loads only what the façade names.
"""
