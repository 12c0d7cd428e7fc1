package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// tracingWanted reads the standard OpenTelemetry environment: tracing is
// on when OTEL_TRACES_EXPORTER is "otlp", or unset with an OTLP endpoint
// given (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),
// and OTEL_SDK_DISABLED is not "true". Off otherwise: no provider is set
// and every span is a no-op.
func tracingWanted(getenv func(string) string) (bool, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false, nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "otlp":
	case "none":
		return false, nil
	case "":
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return false, nil
		}
	default:
		return false, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: only otlp and none are supported", exp)
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := strings.TrimSpace(getenv(k)); p != "" && p != "http/protobuf" {
			return false, fmt.Errorf("%s=%q: only http/protobuf is supported", k, p)
		}
	}
	return true, nil
}

// setupTracing installs, when the environment asks for it (see
// tracingWanted), a TracerProvider exporting over OTLP/HTTP in batches,
// configured by the standard OTEL_EXPORTER_OTLP_* variables (endpoint,
// headers, timeout...), sampled by OTEL_TRACES_SAMPLER, with the service
// name from OTEL_SERVICE_NAME ("outflow" by default). The W3C trace context
// and baggage propagators are set either way. shutdown flushes the spans
// still buffered.
func setupTracing(ctx context.Context, getenv func(string) string) (shutdown func(), err error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	on, err := tracingWanted(getenv)
	if err != nil || !on {
		return func() {}, err
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName("outflow")),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(sctx)
	}, nil
}
