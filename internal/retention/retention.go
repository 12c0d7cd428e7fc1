package retention

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/internal/advisory"
	"github.com/outflow-dev/outflow/internal/configcheck"
	"github.com/outflow-dev/outflow/internal/poll"
)

// Walk is where a round of one table stands: rows before Cutoff are due;
// After is the last key a batch scanned (-1 before the first), for a batch
// that walks its table in key order.
type Walk struct {
	Cutoff time.Time
	After  int64
}

// Batch deletes, in tx, one batch of its table's rows due at w.Cutoff,
// moves w.After past what it scanned when it walks the table, and says how
// many rows went and whether more may be due (the next batch then runs at
// once, in a transaction of its own).
type Batch func(ctx context.Context, tx pgx.Tx, w *Walk) (deleted int64, more bool, err error)

// Table is one table of a [Job]: its name, for logs, errors and metrics,
// and its batch.
type Table struct {
	Name  string
	Batch Batch
}

// Job is one purge.
type Job struct {
	// Name is what it purges, for the logs: "purged <Name>", "purge <Name>".
	Name string
	DB   advisory.Beginner
	// Lock, when not 0, elects the instance that purges: each batch's
	// transaction takes it first (advisory.InTx), and a batch that finds it
	// taken ends the round.
	Lock      advisory.Class
	Retention time.Duration
	// Tables are purged in order, each until it reports nothing more due;
	// an error ends the round.
	Tables []Table
	// Logger gets the counts of a round that deleted rows; nil: not logged.
	Logger *slog.Logger
	// Deleted, when set, is told each committed batch's rows (metrics).
	Deleted func(table string, n int64)
}

// Once runs one round for the rows older than Retention and returns how
// many it deleted from all tables.
func (j *Job) Once(ctx context.Context) (int64, error) {
	return j.Before(ctx, time.Now().Add(-j.Retention))
}

// Before is Once for the rows due at cutoff.
func (j *Job) Before(ctx context.Context, cutoff time.Time) (total int64, err error) {
	var counts []any
	for _, t := range j.Tables {
		n, busy, err := j.table(ctx, t, &Walk{Cutoff: cutoff, After: -1})
		total += n
		counts = append(counts, t.Name, n)
		if err != nil || busy {
			return total, j.logged(total, counts, err)
		}
	}
	return total, j.logged(total, counts, nil)
}

func (j *Job) logged(total int64, counts []any, err error) error {
	if total > 0 && j.Logger != nil {
		j.Logger.Info("purged "+j.Name, append(counts, "retention", j.Retention)...)
	}
	return err
}

// table runs t's batches; busy: another instance holds the lock.
func (j *Job) table(ctx context.Context, t Table, w *Walk) (total int64, busy bool, err error) {
	for {
		var n int64
		more, ok := false, true
		batch := func(tx pgx.Tx) (err error) {
			n, more, err = t.Batch(ctx, tx, w)
			return err
		}
		if j.Lock != 0 {
			ok, err = advisory.InTx(ctx, j.DB, j.Lock, batch)
		} else {
			err = pgx.BeginFunc(ctx, j.DB, batch)
		}
		if err != nil {
			return total, false, fmt.Errorf("purge %s: %w", t.Name, err)
		}
		if total += n; n > 0 && j.Deleted != nil {
			j.Deleted(t.Name, n)
		}
		if !ok || !more {
			return total, !ok, nil
		}
	}
}

// Run purges at once and then every interval until ctx is done; a failed
// round is logged on Logger (required here) and tried again at the next.
func (j *Job) Run(ctx context.Context, interval time.Duration) {
	poll.Every(ctx, interval, func(ctx context.Context) error {
		_, err := j.Once(ctx)
		return err
	}, poll.Warn(j.Logger, "purge "+j.Name))
}

// Defaults fills in the settings every purge's configuration has: 1000
// rows a batch, a round a minute, slog.Default().
func Defaults(batchSize *int, interval *time.Duration, logger **slog.Logger) {
	*batchSize = cmp.Or(*batchSize, 1000)
	*interval = cmp.Or(*interval, time.Minute)
	*logger = cmp.Or(*logger, slog.Default())
}

// Check records, in errs, what is wrong with the settings every purge's
// configuration has, for its validation to report with its own.
func Check(errs *configcheck.Errors, batchSize int, interval time.Duration) {
	errs.Check(batchSize >= 1 && batchSize <= 100_000, "BatchSize", "must be between 1 and 100000")
	errs.Check(interval > 0, "Interval", "must be positive")
}
