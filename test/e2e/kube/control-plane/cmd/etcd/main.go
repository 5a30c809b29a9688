// Command etcd is the etcd server at the version this Kubernetes release was tested with (the
// go.etcd.io/etcd/server/v3 its go.mod requires), built here because the module's own main
// package cannot be installed with its replaces.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
