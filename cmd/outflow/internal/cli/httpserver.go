package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// httpTimeouts bound what a client can hold of the API server: a slow
// client (headers or a body sent a byte at a time), a slow reader of the
// response, an idle keep-alive connection. Without them each holds a
// connection, a goroutine and, mid-body, a request forever.
type httpTimeouts struct {
	readHeader, read, write, idle time.Duration
}

// Defaults of the API server's timeouts: a request of at most 1 MiB is read
// well within 30s on any working link; a command commits in well under the
// write timeout.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
)

func (t *httpTimeouts) register(fs *pflag.FlagSet) {
	fs.DurationVar(&t.readHeader, "read-header-timeout", DefaultReadHeaderTimeout, "how long the API waits for a request's headers")
	fs.DurationVar(&t.read, "read-timeout", DefaultReadTimeout, "how long the API waits for a whole request, headers and body (a body trickled in is cut off)")
	fs.DurationVar(&t.write, "write-timeout", DefaultWriteTimeout, "how long the API may take from the end of a request's headers to the end of its response")
	fs.DurationVar(&t.idle, "idle-timeout", DefaultIdleTimeout, "how long the API keeps an idle keep-alive connection open")
}

func (t httpTimeouts) validate() error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"read-header-timeout", t.readHeader}, {"read-timeout", t.read}, {"write-timeout", t.write}, {"idle-timeout", t.idle}} {
		if d.v <= 0 {
			return fmt.Errorf("invalid --%s: must be positive", d.flag)
		}
	}
	if t.readHeader > t.read {
		return fmt.Errorf("invalid --read-header-timeout: must be at most --read-timeout")
	}
	return nil
}

// DefaultMetricsAddr is where `serve` and `forward` serve /metrics,
// /healthz and /readyz; DefaultWorkerMetricsAddr is `worker`'s, so that a
// forwarder and a worker run side by side on one host with the defaults.
const (
	DefaultMetricsAddr       = "127.0.0.1:9464"
	DefaultWorkerMetricsAddr = "127.0.0.1:9465"
)

// metricsAddrEnv overrides the default of --metrics-addr (a port of 0 picks
// a free one, which the start-up log names).
const metricsAddrEnv = "METRICS_ADDR"

func addMetricsAddrFlag(fs *pflag.FlagSet, dst *string, def, usage string) {
	fs.StringVar(dst, "metrics-addr", def, usage+" (env "+metricsAddrEnv+"; empty: none)")
}

// resolveMetricsAddr applies the environment under the flag: the flag,
// then METRICS_ADDR, then the default.
func resolveMetricsAddr(cmd *cobra.Command, flagValue string) string {
	if cmd.Flags().Changed("metrics-addr") {
		return flagValue
	}
	if v, ok := os.LookupEnv(metricsAddrEnv); ok {
		return v
	}
	return flagValue
}

// serveMetrics serves reg's /metrics, /healthz and ready's /readyz on addr
// until stop. /healthz says the process is alive and serving, nothing more
// (a liveness probe that restarts it when the database is down would only
// add restarts to the outage); /readyz says whether its roles can work.
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry, ready *readiness, logger *slog.Logger) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.Handle("/readyz", ready)
	stop, bound, err := serveBackground(ctx, addr, mux, logger)
	if err != nil {
		return nil, fmt.Errorf("invalid --metrics-addr: %w", err)
	}
	logger.Info("serving metrics", slog.String("addr", bound))
	return stop, nil
}
