package forwarder

import (
	"context"
	"time"
)

// Auditor is implemented by a [Broker] that can tell when it lost entries it
// had acknowledged: a Redis failover to a replica that had not caught up, a
// Redis restarted without persistence, a NATS stream deleted and recreated.
// The forwarder that exports the outbox gauges (the holder of partition 0)
// audits every broker topic the outbox publishes to, every
// Config.AuditInterval, and publishes again the rows a loss may have taken.
//
// Audit must be cheap (a few commands per broker topic, never a read of the
// entries themselves) and must not take normal trimming of acknowledged
// entries for a loss.
type Auditor interface {
	// Topics lists the broker topics (streams, subjects) of an outbox
	// topic: one per partition.
	Topics(topic string) []string
	// BrokerTopic is the broker topic a row of topic and aggregateID goes
	// to: one of Topics(topic).
	BrokerTopic(topic, aggregateID string) string
	// Audit checks one broker topic against prev, the state the previous
	// call returned for it (nil the first time, or after the state was
	// lost: take a baseline, report no loss). It returns the state to pass
	// next time, which the forwarder keeps in PostgreSQL, and a non-nil
	// Loss when the broker no longer holds entries it acknowledged since
	// prev was taken.
	Audit(ctx context.Context, brokerTopic string, prev []byte) (next []byte, loss *Loss, err error)
}

// Loss is what an [Auditor] found missing on one broker topic.
type Loss struct {
	// Since is the earliest time (the broker's clock) from which entries
	// may be gone: every row of the broker topic published at or after it,
	// less Config.AuditMargin, is published again. The auditor takes it
	// from the oldest entry some consumer group had not acknowledged when
	// the state was taken, so that what every group had already handled is
	// not sent again.
	Since time.Time
	// Reason says what showed the loss, for the log and the metrics, e.g.
	// "stream missing", "entries-added went back from 1200 to 900".
	Reason string
}
