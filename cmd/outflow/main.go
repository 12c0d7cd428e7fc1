// Command outflow runs Outflow's reference payments service and its tools:
// migrate, serve, demo, version. See `outflow --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/outflow-dev/outflow/cmd/outflow/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := cli.Execute(ctx)
	stop()
	os.Exit(code)
}
