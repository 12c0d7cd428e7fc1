package bench

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/claimcheck"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
)

// ClaimCostConfig configures the claim-cost benchmark.
type ClaimCostConfig struct {
	// DatabaseURL is where fresh schemas are made; the benchmark reads the
	// server's pg_wal, so it runs on the database's host. Required.
	DatabaseURL string
	// Sizes are the payload sizes measured, in bytes. Defaults to 300 and
	// 100,000.
	Sizes []int
	// Events is how many events each run writes. Defaults to 2,000.
	Events int
	Out    io.Writer
}

// claimDoc is the benchmark's event: a document whose content makes its
// size.
type claimDoc struct {
	DocumentID string `json:"document_id"`
	Content    string `json:"content"`
}

func (claimDoc) EventType() string { return "document.scanned" }

// ClaimCost measures what an event costs the database with its payload
// inline and by reference (events/outbox Config.ClaimCheck), for each
// size: the WAL of the outbox's and outflow_claim_bodies' relations
// (pg_waldump from a CHECKPOINT, full-page images included) for the write
// and for the retention that removes the event (Purge: the outbox's
// partition and the bodies' day dropped whole, and the VACUUM after it), and the bytes stored per event. One event per transaction.
// The relay is not measured: it reads the outbox row, which by reference
// is the small one, and writes nothing per event.
func ClaimCost(ctx context.Context, cfg ClaimCostConfig) error {
	if len(cfg.Sizes) == 0 {
		cfg.Sizes = []int{300, 100_000}
	}
	if cfg.Events <= 0 {
		cfg.Events = 2_000
	}
	fmt.Fprintf(cfg.Out, "claim check cost: WAL of the outbox's and outflow_claim_bodies' relations per event (pg_waldump from a CHECKPOINT, full-page images included), %d events a run, one a transaction\n", cfg.Events)
	for _, size := range cfg.Sizes {
		for _, byRef := range []bool{false, true} {
			if err := claimCostRun(ctx, cfg, size, byRef); err != nil {
				return err
			}
		}
	}
	return nil
}

func claimCostRun(ctx context.Context, cfg ClaimCostConfig, size int, byRef bool) error {
	pool, drop, err := Schema(ctx, cfg.DatabaseURL, 8)
	if err != nil {
		return err
	}
	defer drop()
	mode := "inline"
	wcfg := outbox.Config{Routes: outbox.Routes{"*": "docs"}, MaxEventBytes: -1}
	if byRef {
		mode = "by reference"
		wcfg.ClaimCheck = outbox.ClaimCheck{Threshold: 1}
	}
	w, err := outbox.NewWriter(wcfg)
	if err != nil {
		return err
	}
	// The events get a partition of their own, of their number of ids, so
	// that retention can drop it whole (as in event-cost).
	if _, err := pool.Exec(ctx, `SELECT setval('outbox_id_seq', (
		SELECT max((regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''?(\d+)''?\)'))[1]::bigint) - 1
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'outbox'::regclass))`); err != nil {
		return err
	}
	made, err := forwarder.EnsurePartitions(ctx, pool, int64(cfg.Events))
	if err != nil {
		return err
	}
	if len(made) == 0 {
		return errors.New("claim cost: no partition made for the events")
	}
	// Today's partition of the bodies, as a running forwarder's purge
	// makes it ahead.
	if err := claimcheck.EnsurePartitions(ctx, pool, time.Now()); err != nil {
		return err
	}
	meter, err := newWALMeter(ctx, pool)
	if err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "\n  payload of %d B, %s:\n", size, mode)

	start, err := meter.mark(ctx)
	if err != nil {
		return err
	}
	for i := range cfg.Events {
		// Random base64, as a scanned document's bytes are: TOAST's
		// compression gains little on it (a repeated text would shrink
		// 100 KB to 1 KB and hide what a real body costs).
		raw := make([]byte, size)
		_, _ = rand.Read(raw)
		p := claimDoc{DocumentID: fmt.Sprintf("doc-%08d", i)}
		p.Content = base64.StdEncoding.EncodeToString(raw)[:max(size-len(`{"document_id":"doc-00000000","content":""}`), 0)]
		ev, err := events.New(ctx, events.Aggregate{Type: "document", ID: uuid.NewString(), Version: 1}, p)
		if err != nil {
			return err
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.PublishTx(ctx, tx, ev) }); err != nil {
			return err
		}
	}
	write, err := claimPhase(ctx, cfg, meter, start, "write (outbox row, and the body's)")
	if err != nil {
		return err
	}
	var stored, outboxStored, bodies int64
	if err := pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass),
		(SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0)::bigint FROM pg_inherits WHERE inhparent = 'outflow_claim_bodies'::regclass),
		(SELECT count(*) FROM outflow_claim_bodies)`, made[0]).Scan(&outboxStored, &stored, &bodies); err != nil {
		return err
	}
	if byRef != (bodies == int64(cfg.Events)) {
		return fmt.Errorf("claim cost: %d bodies stored for %d events %s", bodies, cfg.Events, mode)
	}

	// Retention: every event published (the cursors past them) and, with
	// its body, three days old, past a retention of a day: the bodies'
	// days are dropped only once over (claimcheck's margin). The aging
	// (UPDATEs, moving the bodies to their day's partition) is before the
	// measure.
	if err := claimcheck.EnsurePartitions(ctx, pool, time.Now().Add(-3*24*time.Hour)); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `
		WITH sets AS (INSERT INTO outbox_partition_sets (first_id, base, count) VALUES (0, 0, 1))
		INSERT INTO outbox_partitions (partition, published_through, published_high)
		SELECT 0, m, m FROM (SELECT max(id) AS m FROM outbox) x`); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox SET created_at = created_at - interval '3 days'`); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `UPDATE outflow_claim_bodies SET created_at = created_at - interval '3 days'`); err != nil {
		return err
	}
	// The rows the aging moved out of today's partition are vacuumed
	// before the measure: a real body is never moved.
	if _, err := pool.Exec(ctx, `VACUUM outbox, outflow_claim_bodies`); err != nil {
		return err
	}
	if start, err = meter.mark(ctx); err != nil {
		return err
	}
	if _, err := forwarder.Purge(ctx, pool, 24*time.Hour, 10_000); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `VACUUM outbox, outflow_claim_bodies`); err != nil {
		return err
	}
	var left int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM outflow_claim_bodies)`).Scan(&left); err != nil {
		return err
	}
	if left != 0 {
		return fmt.Errorf("claim cost: %d rows left after the purge", left)
	}
	retire, err := claimPhase(ctx, cfg, meter, start, "retention (Purge, then VACUUM)")
	if err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "    whole life in the database: %.0f B/event of WAL (write %.0f + retention %.0f)\n", write+retire, write, retire)
	fmt.Fprintf(cfg.Out, "    stored: %.0f B per event (outbox partition %.0f + outflow_claim_bodies %.0f; heap, TOAST and indexes)\n",
		float64(outboxStored+stored)/float64(cfg.Events), float64(outboxStored)/float64(cfg.Events), float64(stored)/float64(cfg.Events))
	return nil
}

// claimPhase prints the WAL since start by relation and returns the
// outbox's and the bodies' bytes per event.
func claimPhase(ctx context.Context, cfg ClaimCostConfig, meter *walMeter, start, name string) (float64, error) {
	by, err := meter.since(ctx, start)
	if err != nil {
		return 0, err
	}
	table, total := walTable(by, cfg.Events, "outbox", "outflow_claim_bodies")
	fmt.Fprintf(cfg.Out, "    %s: %.0f B/event\n%s", name, total, table)
	return total, nil
}
