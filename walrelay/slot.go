package walrelay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/internal/configcheck"
)

// ErrSlotLost is the relay's state, and Ready's error, when its replication
// slot can no longer be read: PostgreSQL invalidated it (wal_status "lost",
// it passed max_slot_wal_keep_size), or a slot recorded in
// outbox_wal_slots is gone (dropped, or not carried over by a failover).
// The events committed since its last confirmed position were never
// relayed. The relay does not create the slot again on its own: run
// [RecoverSlot] (`outflow relay recover-slot`), which records the lost
// range. See docs/wal-mode.md.
var ErrSlotLost = errors.New("walrelay: replication slot lost")

// ErrFailoverUnsupported is the relay's error when Config.FailoverSlot
// asks for a failover slot on a PostgreSQL before 17.
var ErrFailoverUnsupported = errors.New("walrelay: failover slots need PostgreSQL 17")

// ErrSlotNotLost is returned by [RecoverSlot] for a slot that is fine.
var ErrSlotNotLost = errors.New("walrelay: the replication slot is not lost")

// Querier is a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type querier = Querier

// slotState is the slot as pg_replication_slots shows it.
type slotState struct {
	exists    bool
	walStatus string
	confirmed *string // confirmed_flush_lsn
	// lag is WAL written since confirmed; retained, since restart_lsn.
	lag, retained *int64
	safeWALSize   *int64 // NULL without max_slot_wal_keep_size
	// recorded: outbox_wal_slots has the slot (the relay made or adopted
	// it); recordedLSN is the last position it confirmed there.
	recorded    bool
	recordedLSN *string
}

func readSlot(ctx context.Context, q querier, slot string) (slotState, error) {
	var st slotState
	err := q.QueryRow(ctx, `
		SELECT s.slot_name IS NOT NULL, coalesce(s.wal_status, ''), s.confirmed_flush_lsn::text,
		       pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint,
		       pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint,
		       s.safe_wal_size,
		       r.slot_name IS NOT NULL, r.confirmed_lsn::text
		FROM (SELECT 1) one
		LEFT JOIN pg_replication_slots s ON s.slot_name = $1 AND s.database = current_database()
		LEFT JOIN outbox_wal_slots r ON r.slot_name = $1`, slot).Scan(
		&st.exists, &st.walStatus, &st.confirmed, &st.lag, &st.retained, &st.safeWALSize, &st.recorded, &st.recordedLSN)
	if err != nil {
		return st, fmt.Errorf("read replication slot %s: %w", slot, err)
	}
	return st, nil
}

// status is the slot_wal_status label.
func (st slotState) status() string {
	if !st.exists {
		return "missing"
	}
	return st.walStatus
}

// lostErr is ErrSlotLost for a slot that is lost or, recorded, missing;
// nil otherwise (a slot never made is not lost: the relay makes it).
func (st slotState) lostErr(slot string) error {
	from := "unknown"
	if st.recordedLSN != nil {
		from = *st.recordedLSN
	} else if st.confirmed != nil {
		from = *st.confirmed
	}
	switch {
	case st.exists && st.walStatus == "lost":
		return fmt.Errorf("%w: slot %s was invalidated (wal_status lost, past max_slot_wal_keep_size): the events committed after %s were not relayed; run `outflow relay recover-slot` to record the lost range and create a new slot",
			ErrSlotLost, slot, from)
	case !st.exists && st.recorded:
		return fmt.Errorf("%w: slot %s, which the relay recorded in outbox_wal_slots, is missing (dropped, or not carried over by a failover): the events committed after %s were not relayed; run `outflow relay recover-slot` to record the lost range and create a new slot",
			ErrSlotLost, slot, from)
	}
	return nil
}

func (m *metrics) setSlot(st slotState) {
	m.setStatus(st.status())
	if st.lag != nil {
		m.slotLagBytes.Set(float64(*st.lag))
	}
	if st.retained != nil {
		m.slotRetainedBytes.Set(float64(*st.retained))
	} else {
		m.slotRetainedBytes.Set(0)
	}
	switch {
	case st.safeWALSize != nil:
		m.slotSafeWALSize.Set(float64(*st.safeWALSize))
	case st.exists && st.walStatus != "lost":
		m.slotSafeWALSize.Set(math.Inf(1))
	default:
		m.slotSafeWALSize.Set(0)
	}
}

// ensureSlot makes sure the reader has a slot to read: it checks the slot,
// records a slot it finds but has no record of, and creates the slot
// (with the empty publication pgoutput needs) only when it was never made.
func (r *Relay) ensureSlot(ctx context.Context, conn *pgx.Conn) error {
	st, err := readSlot(ctx, conn, r.cfg.SlotName)
	if err != nil {
		return err
	}
	if err := st.lostErr(r.cfg.SlotName); err != nil {
		return err
	}
	if st.exists {
		if !st.recorded {
			_, err := conn.Exec(ctx, `INSERT INTO outbox_wal_slots (slot_name, confirmed_lsn) VALUES ($1, $2::pg_lsn) ON CONFLICT DO NOTHING`,
				r.cfg.SlotName, st.confirmed)
			if err != nil {
				return fmt.Errorf("record replication slot: %w", err)
			}
		}
		return nil
	}
	at, err := createSlot(ctx, conn, r.cfg.SlotName, r.cfg.Publication, r.cfg.FailoverSlot)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox_wal_slots (slot_name, confirmed_lsn) VALUES ($1, $2::pg_lsn)`, r.cfg.SlotName, at); err != nil {
		return fmt.Errorf("record replication slot: %w", err)
	}
	r.cfg.Logger.Info("replication slot created", "slot", r.cfg.SlotName, "lsn", at)
	return nil
}

// createSlot creates the publication (empty: only messages are decoded)
// if missing, and the slot; it returns the slot's first position.
func createSlot(ctx context.Context, q querier, slot, publication string, failover bool) (string, error) {
	var have bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, publication).Scan(&have); err != nil {
		return "", fmt.Errorf("look for publication: %w", err)
	}
	if !have {
		if _, err := q.Exec(ctx, `CREATE PUBLICATION `+pgx.Identifier{publication}.Sanitize()); err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "42710" { // duplicate_object: made meanwhile
				return "", fmt.Errorf("create publication %s: %w", publication, err)
			}
		}
	}
	create := `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')`
	if failover {
		var version int
		if err := q.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
			return "", fmt.Errorf("server version: %w", err)
		}
		if version < 170000 {
			return "", fmt.Errorf("%w: PostgreSQL %d.%d has no failover slots (17 has): keep the slot across a failover with an extension (pg_failover_slots) or the operator's slot sync, and leave FailoverSlot off",
				ErrFailoverUnsupported, version/10000, version%10000/100)
		}
		create = `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`
	}
	var at string
	if err := q.QueryRow(ctx, create, slot).Scan(&at); err != nil {
		return "", fmt.Errorf("create replication slot %s: %w", slot, err)
	}
	return at, nil
}

// LostRange is what [RecoverSlot] recorded: the WAL between From and To
// was never read by the relay, so the events committed in it were not
// relayed (they are not in outbox_wal_history either).
type LostRange struct {
	Slot string
	// Status is why: "lost" (invalidated) or "missing".
	Status string
	// From is the last position the relay confirmed, To the new slot's
	// first: PostgreSQL LSNs.
	From, To string
}

// RecoverConfig configures [RecoverSlot].
type RecoverConfig struct {
	// SlotName and Publication are the relay's. Default as in [Config].
	SlotName, Publication string
	// FailoverSlot is the relay's Config.FailoverSlot.
	FailoverSlot bool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *RecoverConfig) setDefaults() {
	c.SlotName = cmp.Or(c.SlotName, DefaultSlotName)
	c.Publication = cmp.Or(c.Publication, DefaultPublication)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

func (c *RecoverConfig) validate() error {
	var errs configcheck.Errors
	checkSlot(&errs, c.SlotName, c.Publication)
	return errs.Err("recover slot config")
}

// RecoverSlot is the operator's answer to [ErrSlotLost]: with the reader's
// lock held (no relay reads meanwhile), it drops the invalidated slot,
// creates a new one, and records in outbox_wal_slots the range whose events
// were never relayed, which it also logs at Error and returns. The relays
// then read from the new slot on their own. It refuses a slot that is not
// lost ([ErrSlotNotLost]). The lost events can be salvaged from a WAL
// archive (pg_waldump on the range, see docs/wal-mode.md) or rebuilt from
// the business tables; nothing does it silently.
func RecoverSlot(ctx context.Context, pool *pgxpool.Pool, cfg RecoverConfig) (LostRange, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return LostRange{}, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return LostRange{}, fmt.Errorf("recover slot: %w", err)
	}
	defer conn.Release()
	// A slot that is fine is refused before the lock: a reading relay
	// holds it for good.
	if st, err := readSlot(ctx, conn, cfg.SlotName); err != nil {
		return LostRange{}, err
	} else if st.lostErr(cfg.SlotName) == nil {
		return LostRange{}, fmt.Errorf("%w: slot %s is %s", ErrSlotNotLost, cfg.SlotName, st.status())
	}
	// The relays let go of the lock every StandbyRetry while the slot is
	// lost; lock_timeout bounds the wait for one that does not.
	if _, err := conn.Exec(ctx, `SET lock_timeout = '30s'`); err != nil {
		return LostRange{}, fmt.Errorf("recover slot: %w", err)
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `RESET lock_timeout`) }()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, lockKey(cfg.SlotName)); err != nil {
		return LostRange{}, fmt.Errorf("recover slot: take the reader's lock: %w", err)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, lockKey(cfg.SlotName))
	}()
	st, err := readSlot(ctx, conn, cfg.SlotName)
	if err != nil {
		return LostRange{}, err
	}
	if st.lostErr(cfg.SlotName) == nil {
		return LostRange{}, fmt.Errorf("%w: slot %s is %s", ErrSlotNotLost, cfg.SlotName, st.status())
	}
	lr := LostRange{Slot: cfg.SlotName, Status: st.status(), From: "0/0"}
	if st.recordedLSN != nil {
		lr.From = *st.recordedLSN
	} else if st.confirmed != nil {
		lr.From = *st.confirmed
	}
	if st.exists {
		if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, cfg.SlotName); err != nil {
			return LostRange{}, fmt.Errorf("recover slot: drop the lost slot: %w", err)
		}
	}
	if lr.To, err = createSlot(ctx, conn, cfg.SlotName, cfg.Publication, cfg.FailoverSlot); err != nil {
		return LostRange{}, fmt.Errorf("recover slot: %w", err)
	}
	if _, err := conn.Exec(ctx, `
		INSERT INTO outbox_wal_slots (slot_name, confirmed_lsn, lost_from, lost_to, lost_status, recovered_at)
		VALUES ($1, $3::pg_lsn, $2::pg_lsn, $3::pg_lsn, $4, now())
		ON CONFLICT (slot_name) DO UPDATE SET created_at = now(), confirmed_lsn = excluded.confirmed_lsn, confirmed_at = NULL,
		    lost_from = excluded.lost_from, lost_to = excluded.lost_to, lost_status = excluded.lost_status, recovered_at = now()`,
		cfg.SlotName, lr.From, lr.To, lr.Status); err != nil {
		return LostRange{}, fmt.Errorf("recover slot: record the lost range (the new slot exists): %w", err)
	}
	cfg.Logger.Error("replication slot recovered: the events committed in the lost range were not relayed",
		"slot", lr.Slot, "status", lr.Status, "lost_from", lr.From, "lost_to", lr.To)
	return lr, nil
}

// lockKey keys the reader's advisory lock: one reader per slot.
func lockKey(slot string) string { return "outflow.walrelay:" + slot }
