from perago.cli import main

main()
