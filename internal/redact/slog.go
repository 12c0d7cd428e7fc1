package redact

import (
	"context"
	"fmt"
	"log/slog"
)

// Handler wraps h so that every record's message and string attributes
// (errors included) have the secrets of conns replaced ([Text]): a library
// that quotes a connection string in an error, logged anywhere, leaks
// nothing.
func Handler(h slog.Handler, conns ...string) slog.Handler {
	return &handler{inner: h, conns: conns}
}

type handler struct {
	inner slog.Handler
	conns []string
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, Text(r.Message, h.conns...), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.inner.Handle(ctx, out)
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(as))
	for i, a := range as {
		clean[i] = h.attr(a)
	}
	return &handler{inner: h.inner.WithAttrs(clean), conns: h.conns}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{inner: h.inner.WithGroup(name), conns: h.conns}
}

func (h *handler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, Text(v.String(), h.conns...))
	case slog.KindGroup:
		g := v.Group()
		clean := make([]any, len(g))
		for i, x := range g {
			clean[i] = h.attr(x)
		}
		return slog.Group(a.Key, clean...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, Text(x.Error(), h.conns...))
		default:
			return slog.String(a.Key, Text(fmt.Sprint(x), h.conns...))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
