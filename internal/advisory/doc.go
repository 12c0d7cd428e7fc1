// Package advisory holds Outflow's PostgreSQL advisory locks: the one list
// of their keys (keys.go) and the one way a job elects the instance that
// runs a round of it ([InTx], [Try]): the round's transaction takes its
// class's try-lock for the current schema; whoever gets it runs the round,
// the others skip theirs. Nothing is held between rounds: a dead instance
// holds nothing, and nobody needs telling it was elected.
//
// Two exporters of gauges elect otherwise, on purpose: the gauges need one
// exporter for a stretch of time, and a per-round lock would hand the
// export to every instance in turn. The forwarder's outbox gauges (and its
// audit) run on the holder of lease partition 0, which every forwarder
// knows without a query; the webhook Sender's on the holder of a session
// lock (WebhookStats), Senders having no partitions.
package advisory
