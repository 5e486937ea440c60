// The real kubectl (k8s.io/kubectl's command, the code of the kubectl
// binary of the same release), for the benchmarks that measure hermes
// against it: `kube-harness kubectl ARGS...` is `kubectl ARGS...`.

package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
)

func cmdKubectl(args []string) {
	command := cmd.NewDefaultKubectlCommand()
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}
