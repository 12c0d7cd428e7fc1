package replay

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrEmptyFilter is returned for a [Filter] that selects nothing in
// particular and does not say All: a replay of the whole outbox must be
// asked for.
var ErrEmptyFilter = errors.New("replay: no filter: choose rows by topic, aggregate, event type or time, or say All")

// The sources of events a [Filter] chooses from.
const (
	// SourceOutbox is the outbox table (table mode): published rows.
	SourceOutbox = "outbox"
	// SourceWALHistory is outbox_wal_history, what the WAL mode's relay
	// (package walrelay) read, in commit order, each event once.
	SourceWALHistory = "wal_history"
)

// Filter chooses outbox rows. Set fields narrow the choice (AND); within a
// list, any element matches (OR). Only published rows are chosen.
type Filter struct {
	// Source is where the events are read: SourceOutbox (the default,
	// "") or SourceWALHistory. It chooses nothing by itself.
	Source string
	// Topic is the outbox topic.
	Topic string
	// AggregateType is the rows' aggregate type. Required with
	// AggregateIDs.
	AggregateType string
	// AggregateIDs are aggregate ids of AggregateType.
	AggregateIDs []string
	// EventTypes are event types.
	EventTypes []string
	// Since and Until bound the events' occurred_at: Since <= occurred_at
	// < Until. Zero: unbounded.
	Since, Until time.Time
	// All must be set to choose every retained row (no other field set).
	All bool
}

// Validate reports a filter that cannot be used, naming the field.
func (f Filter) Validate() error {
	switch {
	case f.Source != "" && f.Source != SourceOutbox && f.Source != SourceWALHistory:
		return fmt.Errorf("replay filter: Source %q: %s or %s", f.Source, SourceOutbox, SourceWALHistory)
	case len(f.AggregateIDs) > 0 && f.AggregateType == "":
		return errors.New("replay filter: AggregateIDs need AggregateType")
	case !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until):
		return errors.New("replay filter: Since must be before Until")
	case f.empty() && !f.All:
		return ErrEmptyFilter
	case !f.empty() && f.All:
		return errors.New("replay filter: All excludes every other field")
	}
	for _, id := range f.AggregateIDs {
		if id == "" {
			return errors.New("replay filter: an aggregate id is empty")
		}
	}
	for _, t := range f.EventTypes {
		if t == "" {
			return errors.New("replay filter: an event type is empty")
		}
	}
	return nil
}

func (f Filter) empty() bool {
	return f.Topic == "" && f.AggregateType == "" && len(f.AggregateIDs) == 0 && len(f.EventTypes) == 0 &&
		f.Since.IsZero() && f.Until.IsZero()
}

// publishedCond tells an outbox row o published, as the view outbox_state
// says it: not in outbox_failures, and its partition's cursor past it
// (published_through, or published_high but for the transactions in
// waiting_xids). Written out rather than a join to the view, so that it
// applies to the rows the indexed conditions chose, each by primary key
// (outbox_failures, outbox_partitions): the view joined whole would read
// every outbox row. (No bound on the id from the cursors: the planner
// would take it for a narrow range of the primary key, and prefer it to
// the aggregate index.) A row published since its partition's holder last
// recorded its cursor (its lease tick) is not chosen yet.
const publishedCond = `NOT EXISTS (SELECT 1 FROM outbox_failures f WHERE f.id = o.id)
	AND EXISTS (SELECT 1 FROM outbox_partitions p
		WHERE p.partition = outbox_partition_of(o.id, o.aggregate_id)
		  AND (o.id <= p.published_through OR (o.id <= p.published_high AND o.transaction_id <> ALL(p.waiting_xids))))`

// where renders f as a condition on the outbox (alias o) whose parameters
// start at $first, with their values: the set fields, then publishedCond.
// Only the set fields appear, so that the planner sees each query's real
// shape (an aggregate filter uses outbox_aggregate_version_idx), and
// judges a row published only once they chose it.
func (f Filter) where(first int) (string, []any) {
	var conds []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		conds = append(conds, strings.ReplaceAll(cond, "$?", "$"+strconv.Itoa(first+len(args)-1)))
	}
	if f.Topic != "" {
		add("o.topic = $?", f.Topic)
	}
	if f.AggregateType != "" {
		add("o.aggregate_type = $?", f.AggregateType)
	}
	if len(f.AggregateIDs) > 0 {
		add("o.aggregate_id = ANY($?::text[])", f.AggregateIDs)
	}
	if len(f.EventTypes) > 0 {
		add("o.event_type = ANY($?::text[])", f.EventTypes)
	}
	if !f.Since.IsZero() {
		add("o.occurred_at >= $?", f.Since)
	}
	if !f.Until.IsZero() {
		add("o.occurred_at < $?", f.Until)
	}
	if f.walHistory() {
		// The history holds what the relay read.
		if len(conds) == 0 {
			conds = append(conds, "true")
		}
	} else {
		conds = append(conds, publishedCond)
	}
	return strings.Join(conds, " AND "), args
}

func (f Filter) walHistory() bool { return f.Source == SourceWALHistory }

// String describes f for a log line or a confirmation prompt.
func (f Filter) String() string {
	var parts []string
	if f.walHistory() {
		parts = append(parts, "from the WAL history")
	}
	if f.All {
		return strings.Join(append(parts, "every retained row"), ", ")
	}
	if f.Topic != "" {
		parts = append(parts, fmt.Sprintf("topic %s", f.Topic))
	}
	if f.AggregateType != "" {
		s := "aggregate type " + f.AggregateType
		if n := len(f.AggregateIDs); n > 0 {
			s += fmt.Sprintf(", %d aggregate id(s)", n)
		}
		parts = append(parts, s)
	}
	if len(f.EventTypes) > 0 {
		parts = append(parts, "event types "+strings.Join(f.EventTypes, ","))
	}
	if !f.Since.IsZero() {
		parts = append(parts, "since "+f.Since.UTC().Format(time.RFC3339))
	}
	if !f.Until.IsZero() {
		parts = append(parts, "until "+f.Until.UTC().Format(time.RFC3339))
	}
	return strings.Join(parts, ", ")
}
