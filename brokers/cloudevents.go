package brokers

import (
	"context"

	"github.com/outflow-dev/outflow/brokers/cloudevents"
	"github.com/outflow-dev/outflow/forwarder"
)

// WithCloudEvents returns inner publishing every message with cfg's
// CloudEvents attributes in binding b (see package brokers/cloudevents):
// what each built-in backend's Broker is, so that everything Outflow
// publishes (the forwarder's rows, the WAL relay's, replays, discard
// markers) carries them, and nothing more is stored in the outbox. It
// returns inner itself when cfg.Disabled.
//
// The result keeps inner's optional interfaces: a [forwarder.PayloadLimiter]
// (its MessageBytes then counts the message with the attributes, so the
// outbox writer and the forwarder size what is really sent) and a
// [forwarder.Auditor]. It is a [forwarder.MetadataAdder] too.
func WithCloudEvents(inner forwarder.Broker, b cloudevents.Binding, cfg cloudevents.Config) forwarder.Broker {
	if cfg.Disabled {
		return inner
	}
	ce := ceBroker{inner: inner, b: b, cfg: cfg.WithDefaults()}
	_, limits := inner.(forwarder.PayloadLimiter)
	_, audits := inner.(forwarder.Auditor)
	switch {
	case limits && audits:
		return ceAuditLimiter{ceAuditor{ce}}
	case limits:
		return ceLimiter{ce}
	case audits:
		return ceAuditor{ce}
	}
	return ce
}

type ceBroker struct {
	inner forwarder.Broker
	b     cloudevents.Binding
	cfg   cloudevents.Config
}

// with returns msgs with the attributes, in new messages.
func (c ceBroker) with(msgs []forwarder.Outgoing) []forwarder.Outgoing {
	out := make([]forwarder.Outgoing, len(msgs))
	for i, m := range msgs {
		out[i] = m
		out[i].Message = c.cfg.Apply(c.b, m.Message)
	}
	return out
}

func (c ceBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	return c.inner.Publish(ctx, c.with(msgs))
}

func (c ceBroker) AddedMetadataBytes(m forwarder.Outgoing) int {
	return c.cfg.AddedBytes(c.b, m.Message)
}

type ceLimiter struct{ ceBroker }

func (c ceLimiter) MaxMessageBytes() int {
	return c.inner.(forwarder.PayloadLimiter).MaxMessageBytes()
}

func (c ceLimiter) MessageBytes(m forwarder.Outgoing) int {
	m.Message = c.cfg.Apply(c.b, m.Message)
	return c.inner.(forwarder.PayloadLimiter).MessageBytes(m)
}

type ceAuditor struct{ ceBroker }

func (c ceAuditor) PublishReceipts(ctx context.Context, msgs []forwarder.Outgoing) ([]forwarder.Receipt, []error) {
	return c.inner.(forwarder.Auditor).PublishReceipts(ctx, c.with(msgs))
}

func (c ceAuditor) Check(ctx context.Context, brokerTopic string, prev []byte, held []forwarder.Held, partial bool) (forwarder.Verdict, error) {
	return c.inner.(forwarder.Auditor).Check(ctx, brokerTopic, prev, held, partial)
}

type ceAuditLimiter struct{ ceAuditor }

func (c ceAuditLimiter) MaxMessageBytes() int { return ceLimiter(c.ceAuditor).MaxMessageBytes() }

func (c ceAuditLimiter) MessageBytes(m forwarder.Outgoing) int {
	return ceLimiter(c.ceAuditor).MessageBytes(m)
}

var (
	_ forwarder.MetadataAdder  = ceBroker{}
	_ forwarder.PayloadLimiter = ceLimiter{}
	_ forwarder.Auditor        = ceAuditor{}
	_ forwarder.Auditor        = ceAuditLimiter{}
	_ forwarder.PayloadLimiter = ceAuditLimiter{}
)
