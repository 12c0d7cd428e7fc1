package actionlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Table is the audit's table, created by framework migration 00031.
const Table = "outflow_operator_actions"

// ErrNotMigrated is returned when the audit's table is not in the
// database (framework migration 00031 not applied): an action that cannot
// be recorded is not done.
var ErrNotMigrated = errors.New("actionlog: " + Table + " does not exist: run `outflow migrate up` (framework migration 00031)")

// Kind is where an action came from.
type Kind string

const (
	// Console is an action taken in the operator console.
	Console Kind = "console"
	// CLI is a command of the outflow tool.
	CLI Kind = "cli"
)

// Kinds are the kinds of actor, in the order the Actions page lists them.
var Kinds = []Kind{Console, CLI}

// Actor is who took an action.
type Actor struct {
	Kind Kind
	// ID is the API key's id (the console), or user@host (the tool).
	ID string
	// Name is the API key's name, "operator" for a FrameworkOnly
	// console's operator key, or the OS user (the tool).
	Name string
	// Command is the tool's command line, its secrets masked; "" for the
	// console.
	Command string
}

// Entry is one action to record.
type Entry struct {
	Actor  Actor
	Action string // dotted: dlq.retry, outbox.discard, replay, consumer.reset, ...
	// Target is what the action named, encoded as JSON: ids, or the filter
	// of "all". Never a secret.
	Target any
	// AggregateType and AggregateID name the one aggregate the action was
	// on, when it was on one (a replay, a reset of one aggregate): the
	// journey of that aggregate shows it. Both or neither.
	AggregateType, AggregateID string
	Count                      int64
	Error                      string
}

// Querier is a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// DB is what [Do] needs: a pool, or a connection.
type DB interface {
	Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Insert records e with q (in the caller's transaction, when q is one) and
// returns the record's id.
func Insert(ctx context.Context, q Querier, e Entry) (int64, error) {
	target, err := json.Marshal(e.Target)
	if err != nil {
		return 0, fmt.Errorf("record action %s: encode target: %w", e.Action, err)
	}
	return insert(ctx, q, e, target)
}

func insert(ctx context.Context, q Querier, e Entry, target []byte) (int64, error) {
	if (e.AggregateType == "") != (e.AggregateID == "") {
		return 0, fmt.Errorf("record action %s: give both AggregateType and AggregateID, or neither", e.Action)
	}
	var id int64
	err := q.QueryRow(ctx, `
		INSERT INTO outflow_operator_actions (actor_kind, actor_id, actor_name, command, action, target, result_count, error,
		                                      aggregate_type, aggregate_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, nullif($9, ''), nullif($10, '')) RETURNING id`,
		string(e.Actor.Kind), e.Actor.ID, e.Actor.Name, e.Actor.Command, e.Action, target, e.Count, e.Error,
		e.AggregateType, e.AggregateID).Scan(&id)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return 0, fmt.Errorf("record action %s: %w", e.Action, ErrNotMigrated)
	}
	if err != nil {
		return 0, fmt.Errorf("record action %s: %w", e.Action, err)
	}
	return id, nil
}

// CommitTimeout bounds what [Do] runs once the change is decided: the
// commit with its record, or the record of a failure alone.
const CommitTimeout = 30 * time.Second

// Do runs do and the insert of its record (e, with do's count) in one
// transaction begun on db, and returns the record's id, do's error and its
// own: the change and its record commit together, or neither does. A do
// that fails is rolled back and recorded alone, with its error and a count
// of 0. e.Target is encoded after do, so do may complete it (a pointer,
// with what the change created); a target that cannot be encoded rolls
// the change back. do's statements run on ctx: a caller that gives up
// before the commit cancels them, and the rollback undoes what was done.
// The commit and the record of a failure do not take ctx's cancellation
// (bounded by [CommitTimeout]): once the change is decided, whether it is
// recorded must not depend on the caller's patience.
func Do(ctx context.Context, db DB, e Entry, do func(ctx context.Context, tx pgx.Tx) (int64, error)) (id int64, doErr error, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("action %s: begin: %w", e.Action, err)
	}
	defer func() {
		dctx, cancel := Detach(ctx)
		defer cancel()
		_ = tx.Rollback(dctx) // a no-op after the commit
	}()
	n, doErr := do(ctx, tx)
	dctx, cancel := Detach(ctx)
	defer cancel()
	if doErr != nil {
		// A rollback that fails closes the connection, which ends the
		// transaction on the server all the same: either way nothing of
		// do is left. The record goes in a transaction of its own, on
		// another of db's connections.
		_ = tx.Rollback(dctx)
		e.Count, e.Error = 0, doErr.Error()
		id, err := Insert(dctx, db, e)
		return id, doErr, err
	}
	e.Count = n
	if id, err = Insert(ctx, tx, e); err != nil {
		return 0, nil, err
	}
	if err := tx.Commit(dctx); err != nil {
		return 0, nil, fmt.Errorf("action %s: commit: %w", e.Action, err)
	}
	return id, nil, nil
}

// Ready returns [ErrNotMigrated] when the audit's table is not in q's
// search_path: an action that cannot be part of a transaction (a replay
// published to a broker) asks first, so as not to act and then fail to
// record it.
func Ready(ctx context.Context, q Querier) error {
	var ok bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('outflow_operator_actions') IS NOT NULL`).Scan(&ok); err != nil {
		return fmt.Errorf("look for %s: %w", Table, err)
	}
	if !ok {
		return ErrNotMigrated
	}
	return nil
}

// Detach is ctx without its cancellation, bounded by [CommitTimeout]: for
// what must finish once begun, the caller gone or not.
func Detach(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), CommitTimeout)
}

// Record is one recorded action.
type Record struct {
	ID                         int64
	At                         time.Time
	Actor                      Actor
	Action                     string
	Target                     json.RawMessage
	Count                      int64
	Error                      string
	AggregateType, AggregateID string
}

const columns = `id, at, actor_kind, actor_id, actor_name, command, action, target, result_count, error,
	coalesce(aggregate_type, ''), coalesce(aggregate_id, '')`

func scan(row pgx.CollectableRow) (Record, error) {
	var r Record
	var kind string
	err := row.Scan(&r.ID, &r.At, &kind, &r.Actor.ID, &r.Actor.Name, &r.Actor.Command, &r.Action, &r.Target, &r.Count,
		&r.Error, &r.AggregateType, &r.AggregateID)
	r.Actor.Kind = Kind(kind)
	return r, err
}

// Get returns the record id, and false when there is none.
func Get(ctx context.Context, q Querier, id int64) (Record, bool, error) {
	rows, err := q.Query(ctx, `SELECT `+columns+` FROM outflow_operator_actions WHERE id = $1`, id)
	if err != nil {
		return Record{}, false, fmt.Errorf("read action %d: %w", id, err)
	}
	r, err := pgx.CollectExactlyOneRow(rows, scan)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read action %d: %w", id, err)
	}
	return r, true, nil
}

// Filter chooses records: "" matches every kind, every action.
type Filter struct {
	Kind   Kind
	Action string
}

// Page is where a page of records starts: the records older than Before,
// or newer than After (one of them at most), or the newest. Limit is the
// page's size.
type Page struct {
	Before, After int64
	Limit         int
}

// Listed is a page of records, newest first.
type Listed struct {
	Records []Record
	// Older and Newer say whether there are records beyond the page.
	Older, Newer bool
}

// List returns a page of the records f chooses, newest first, by keyset on
// the id: a page costs the same however deep it is (through the primary
// key, or outflow_operator_actions_action_idx with an action).
func List(ctx context.Context, q Querier, f Filter, p Page) (Listed, error) {
	if p.Limit < 1 {
		return Listed{}, errors.New("list actions: Limit must be at least 1")
	}
	if p.Before != 0 && p.After != 0 {
		return Listed{}, errors.New("list actions: give Before or After, not both")
	}
	where := `($1 = '' OR actor_kind = $1) AND ($2 = '' OR action = $2)`
	read := func(cond, order string, from int64, limit int) ([]Record, error) {
		rows, err := q.Query(ctx, `SELECT `+columns+` FROM outflow_operator_actions WHERE `+where+cond+
			` ORDER BY id `+order+` LIMIT $4`, string(f.Kind), f.Action, from, limit)
		if err != nil {
			return nil, fmt.Errorf("list actions: %w", err)
		}
		recs, err := pgx.CollectRows(rows, scan)
		if err != nil {
			return nil, fmt.Errorf("list actions: %w", err)
		}
		return recs, nil
	}
	var l Listed
	var err error
	if p.After != 0 {
		// Newer ones, read oldest first from After, then reversed.
		if l.Records, err = read(` AND id > $3`, `ASC`, p.After, p.Limit+1); err != nil {
			return l, err
		}
		l.Newer = len(l.Records) > p.Limit
		l.Records = l.Records[:min(len(l.Records), p.Limit)]
		for i, j := 0, len(l.Records)-1; i < j; i, j = i+1, j-1 {
			l.Records[i], l.Records[j] = l.Records[j], l.Records[i]
		}
		// After itself, or one older than it, is there: the page came
		// from older ones.
		older, err := read(` AND id <= $3`, `DESC`, p.After, 1)
		if err != nil {
			return l, err
		}
		l.Older = len(older) > 0
		return l, nil
	}
	cond := ` AND ($3::bigint = 0 OR id < $3::bigint)`
	if l.Records, err = read(cond, `DESC`, p.Before, p.Limit+1); err != nil {
		return l, err
	}
	l.Older = len(l.Records) > p.Limit
	l.Records = l.Records[:min(len(l.Records), p.Limit)]
	if p.Before != 0 {
		newer, err := read(` AND id >= $3`, `ASC`, p.Before, 1)
		if err != nil {
			return l, err
		}
		l.Newer = len(newer) > 0
	}
	return l, nil
}

// Count is how many records f chooses.
func Count(ctx context.Context, q Querier, f Filter) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, `SELECT count(*) FROM outflow_operator_actions WHERE ($1 = '' OR actor_kind = $1) AND ($2 = '' OR action = $2)`,
		string(f.Kind), f.Action).Scan(&n); err != nil {
		return 0, fmt.Errorf("count actions: %w", err)
	}
	return n, nil
}

// Actions lists the actions recorded at least once, in name order: a
// loose index scan of outflow_operator_actions_action_idx, one probe per
// action, however many records each has.
func Actions(ctx context.Context, q Querier) ([]string, error) {
	rows, err := q.Query(ctx, qActions)
	if err != nil {
		return nil, fmt.Errorf("list recorded actions: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list recorded actions: %w", err)
	}
	return names, nil
}

// qOnAggregate reads an aggregate's records of one action, newest first:
// a backward range scan of outflow_operator_actions_aggregate_idx that the
// Limit stops (TestQueriesUseTheirIndexes).
const qOnAggregate = `SELECT ` + columns + ` FROM outflow_operator_actions
	WHERE aggregate_type = $1 AND aggregate_id = $2 AND action = $3 AND aggregate_id IS NOT NULL
	ORDER BY id DESC LIMIT $4`

// qActions lists the recorded actions by a loose index scan of
// outflow_operator_actions_action_idx.
const qActions = `
	WITH RECURSIVE a(action) AS (
		(SELECT action FROM outflow_operator_actions ORDER BY action LIMIT 1)
		UNION ALL
		SELECT (SELECT action FROM outflow_operator_actions WHERE action > a.action ORDER BY action LIMIT 1)
		FROM a WHERE a.action IS NOT NULL)
	SELECT action FROM a WHERE action IS NOT NULL`

// OnAggregate returns the newest records (at most limit) of action on one
// aggregate, newest first, through outflow_operator_actions_aggregate_idx.
func OnAggregate(ctx context.Context, q Querier, aggregateType, aggregateID, action string, limit int) ([]Record, error) {
	rows, err := q.Query(ctx, qOnAggregate, aggregateType, aggregateID, action, limit)
	if err != nil {
		return nil, fmt.Errorf("read the actions on %s %s: %w", aggregateType, aggregateID, err)
	}
	recs, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("read the actions on %s %s: %w", aggregateType, aggregateID, err)
	}
	return recs, nil
}
