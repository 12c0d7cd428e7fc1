package idempotency

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events"
)

// heldBehindSQL reads the held events of the aggregates $2/$3 (types and
// ids, in pairs), lowest version first, and locks them: those another
// transaction holds (a retry round running them) are skipped, not waited
// for. It runs in the pipeline of the claims, after them: a statement of
// its own, so its snapshot is taken once the claims hold their aggregates'
// locks and it sees every event dead-lettered by the transactions that held those
// locks before. A gap that timed out (dead, reason gap) is read too: it
// heals like a held one. Through dead_letters_open_idx; it finds nothing
// in the common case, an index probe per aggregate.
const heldBehindSQL = `
SELECT d.id, d.message_id::text, d.payload, d.metadata::text, d.aggregate_type, d.aggregate_id, d.aggregate_version
FROM dead_letters d
WHERE d.consumer = $1
  AND (d.status = 'held' OR (d.status = 'dead' AND d.reason = 'gap'))
  AND (d.aggregate_type, d.aggregate_id) IN (SELECT * FROM unnest($2::text[], $3::text[]))
ORDER BY d.aggregate_type, d.aggregate_id, d.aggregate_version
FOR UPDATE SKIP LOCKED`

// aggKey names an aggregate.
type aggKey struct{ typ, id string }

// heldRow is a held event read by heldBehindSQL.
type heldRow struct {
	id       int64
	msgID    string
	payload  []byte
	metadata string
	agg      aggKey
	version  int64
}

// queueHeldBehind queues heldBehindSQL for the aggregates of envs.
func (c *Consumer) queueHeldBehind(q *pgx.Batch, envs ...events.Envelope) {
	types := make([]string, 0, len(envs))
	ids := make([]string, 0, len(envs))
	seen := make(map[aggKey]bool, len(envs))
	for _, env := range envs {
		k := aggKey{env.AggregateType, env.AggregateID}
		if seen[k] {
			continue
		}
		seen[k] = true
		types, ids = append(types, k.typ), append(ids, k.id)
	}
	q.Queue(heldBehindSQL, c.cfg.Consumer, types, ids)
}

// readHeldBehind reads what queueHeldBehind queued.
func readHeldBehind(res pgx.BatchResults) ([]heldRow, error) {
	rows, err := res.Query()
	if err != nil {
		return nil, err
	}
	var (
		out []heldRow
		r   heldRow
	)
	_, err = pgx.ForEachRow(rows, []any{&r.id, &r.msgID, &r.payload, &r.metadata, &r.agg.typ, &r.agg.id, &r.version}, func() error {
		out = append(out, r)
		r = heldRow{}
		return nil
	})
	return out, err
}

// heldOutcome is what applyHeld did: how many held events it applied, and
// whether it left one that could run (its handler failed here, and runs
// alone in the retry loop, where a failure is retried with backoff).
type heldOutcome struct {
	applied []heldRow
	took    time.Duration
	leftDue bool
}

// applyHeld applies, in tx, the held events right behind the versions in
// at (an aggregate's version once the transaction's own messages applied),
// in version order: a held event whose predecessor has just applied need
// not wait for the retry loop and a transaction of its own. Each runs in a
// savepoint: a handler that fails rolls back its own effects only, and its
// event stays held for the retry loop, which runs it alone. Events of an
// aggregate stop at the first that does not apply.
func (c *Consumer) applyHeld(ctx context.Context, tx pgx.Tx, h message.HandlerFunc, rows []heldRow, at map[aggKey]int64) (heldOutcome, error) {
	var res heldOutcome
	start := time.Now()
	stopped := map[aggKey]bool{}
	for _, r := range rows {
		v, ok := at[r.agg]
		if !ok || stopped[r.agg] {
			continue
		}
		if r.version <= v { // applied meanwhile by another path: the claim settles it as a duplicate or stale
			continue
		}
		if r.version != v+1 {
			stopped[r.agg] = true // a gap still open: what follows waits
			continue
		}
		msg := message.NewMessage(r.msgID, r.payload)
		if err := json.Unmarshal([]byte(r.metadata), &msg.Metadata); err != nil {
			stopped[r.agg] = true
			res.leftDue = true // the retry loop reports it
			continue
		}
		msg.SetContext(ctx)
		env, err := events.EnvelopeFromMessage(msg)
		if err != nil {
			stopped[r.agg] = true
			res.leftDue = true
			continue
		}
		_, o, herr := c.apply(ctx, ctx, tx, h, msg, env, false, false, false)
		if herr != nil || o.outcome != applied {
			// Failed, or still not next (an open dead letter below it):
			// the retry loop decides, alone.
			stopped[r.agg] = true
			res.leftDue = res.leftDue || herr != nil
			continue
		}
		if _, err := tx.Exec(ctx, `UPDATE dead_letters SET status = 'resolved', resolved_at = now() WHERE id = $1`, r.id); err != nil {
			return res, fmt.Errorf("idempotency: resolve held message: %w", err)
		}
		at[r.agg] = r.version
		res.applied = append(res.applied, r)
	}
	res.took = time.Since(start)
	return res, nil
}

// applyHeldBehind reads the events held behind env's aggregate and applies
// those right behind env's version (applyHeld), in tx.
func (c *Consumer) applyHeldBehind(ctx context.Context, tx pgx.Tx, h message.HandlerFunc, env events.Envelope) (heldOutcome, error) {
	var q pgx.Batch
	c.queueHeldBehind(&q, env)
	res := tx.SendBatch(ctx, &q)
	rows, err := readHeldBehind(res)
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil || len(rows) == 0 {
		return heldOutcome{}, err
	}
	return c.applyHeld(ctx, tx, h, rows, map[aggKey]int64{{env.AggregateType, env.AggregateID}: env.AggregateVersion})
}

// countHeld counts, once their transaction committed, the held events
// applyHeld applied.
func (c *Consumer) countHeld(res heldOutcome) {
	for _, r := range res.applied {
		c.metrics.count(applied, res.took)
		c.cfg.Logger.Debug("held message applied behind its predecessor", "consumer", c.cfg.Consumer, "message_id", r.msgID,
			"aggregate_id", r.agg.id, "aggregate_version", r.version)
	}
}
