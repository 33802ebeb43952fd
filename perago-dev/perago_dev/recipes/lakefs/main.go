// Command lakefs is lakeFS's own lakefs command, built from the Go module proxy.
package main

import "github.com/treeverse/lakefs/cmd/lakefs/cmd"

func main() { cmd.Execute() }
