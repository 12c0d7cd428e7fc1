package cli

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/tracing"
)

func TestTracingWanted(t *testing.T) {
	for _, tt := range []struct {
		name    string
		env     map[string]string
		want    bool
		wantErr bool
	}{
		{"nothing set: off", nil, false, false},
		{"an endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true, false},
		{"a traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true, false},
		{"otlp to the default endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, false},
		{"none wins over an endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false, false},
		{"disabled SDK", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false, false},
		{"an exporter we lack", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false, true},
		{"grpc", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false, true},
		{"http/protobuf", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tracingWanted(func(k string) string { return tt.env[k] })
			require.Equal(t, tt.wantErr, err != nil, "error: %v", err)
			require.Equal(t, tt.want, got)
		})
	}
}

// With OTEL_EXPORTER_OTLP_ENDPOINT set, spans reach an OTLP/HTTP receiver,
// with the service name of OTEL_SERVICE_NAME. Not parallel: it sets the
// environment and the global TracerProvider.
func TestTracingExportsOverOTLP(t *testing.T) {
	var (
		mu    sync.Mutex
		names []string
		svc   string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil || r.URL.Path != "/v1/traces" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					svc = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					names = append(names, s.Name)
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "outflow-test")
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })

	stop, err := setupTracing(context.Background(), os.Getenv)
	require.NoError(t, err)
	_, span := tracing.Tracer().Start(context.Background(), "exported span")
	span.End()
	stop() // flushes the batch
	outflowtest.WaitFor(t, 10*time.Second, "the span at the receiver", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(names) > 0
	})
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"exported span"}, names)
	require.Equal(t, "outflow-test", svc)
}
