// Command lakectl is lakeFS's own lakectl command, built from the Go module proxy.
package main

import "github.com/treeverse/lakefs/cmd/lakectl/cmd"

func main() { cmd.Execute() }
