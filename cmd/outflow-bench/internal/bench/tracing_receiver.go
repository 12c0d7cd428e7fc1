package bench

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP traces endpoint on loopback that decodes
// each export and counts its spans, so the benchmark's "on" mode pays for
// a real export and can prove the spans arrived.
type otlpReceiver struct {
	srv    *http.Server
	addr   string
	served chan struct{}

	requests, spans, bytes atomic.Int64
	busyNanos              atomic.Int64 // time spent reading and decoding exports
}

// Start listens on a free loopback port and serves until Close.
func (r *otlpReceiver) Start() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("OTLP receiver: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.export)
	r.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	r.addr = ln.Addr().String()
	r.served = make(chan struct{})
	go func() {
		defer close(r.served)
		_ = r.srv.Serve(ln)
	}()
	return nil
}

// URL is the traces endpoint, for otlptracehttp.WithEndpointURL.
func (r *otlpReceiver) URL() string { return "http://" + r.addr + "/v1/traces" }

// Close stops the server.
func (r *otlpReceiver) Close() {
	_ = r.srv.Close()
	<-r.served
}

// emptyResponse is the success answer: an empty ExportTraceServiceResponse
// (no partial success).
var emptyResponse, _ = proto.Marshal(&collectortrace.ExportTraceServiceResponse{})

// busy is the time the receiver has spent reading and decoding exports:
// CPU in this process that the benchmark's subject did not spend.
func (r *otlpReceiver) busy() time.Duration { return time.Duration(r.busyNanos.Load()) }

func (r *otlpReceiver) export(w http.ResponseWriter, req *http.Request) {
	t := time.Now()
	n, err := r.read(req)
	r.busyNanos.Add(int64(time.Since(t)))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.requests.Add(1)
	r.spans.Add(int64(n))
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(emptyResponse)
}

// read decodes one export request and returns its span count.
func (r *otlpReceiver) read(req *http.Request) (int, error) {
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		return 0, fmt.Errorf("content type %q: only application/x-protobuf is served", ct)
	}
	body := io.Reader(req.Body)
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(req.Body)
		if err != nil {
			return 0, fmt.Errorf("gzip: %w", err)
		}
		defer gz.Close()
		body = gz
	}
	raw, err := io.ReadAll(io.LimitReader(body, 64<<20))
	if err != nil {
		return 0, fmt.Errorf("read body: %w", err)
	}
	r.bytes.Add(int64(len(raw)))
	var msg collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &msg); err != nil {
		return 0, fmt.Errorf("decode ExportTraceServiceRequest: %w", err)
	}
	n := 0
	for _, rs := range msg.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			n += len(ss.GetSpans())
		}
	}
	if n == 0 {
		return 0, errors.New("an export without spans")
	}
	return n, nil
}
