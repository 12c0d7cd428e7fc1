package events

// TraceID returns the trace id of a W3C traceparent (its second field), or
// "" when tp is not one.
func TraceID(tp string) string {
	if !traceparentRE.MatchString(tp) {
		return ""
	}
	return tp[3:35]
}

// LogArgs returns the envelope's correlation id and the trace id of its
// traceparent as slog key-value pairs, the ones present only: a log line
// about an event carries them (logger.With(env.LogArgs()...)), so that an
// operator finds every line of one request, and the trace, from any of them.
func (e Envelope) LogArgs() []any {
	return MetadataLogArgs(e.CorrelationID, e.Traceparent)
}

// MetadataLogArgs is [Envelope.LogArgs] of a correlation id and a
// traceparent read elsewhere (the outbox's metadata column).
func MetadataLogArgs(correlationID, traceparent string) []any {
	var args []any
	if correlationID != "" {
		args = append(args, "correlation_id", correlationID)
	}
	if id := TraceID(traceparent); id != "" {
		args = append(args, "trace_id", id)
	}
	return args
}
