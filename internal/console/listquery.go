package console

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The lists' reads: a page by keyset in either direction, the counts
// around it, the errors of the filter grouped, and the set an action on
// "all matching the filter" covers. Every read is bounded: a page and a
// count cost the same at 100 rows or 100,000.

const (
	// countCap bounds what a list counts (its total, the rows before its
	// page): past it the page says "10,000+". A count reads the partial
	// indexes in id order and stops at the cap; an uncapped one reads
	// every open row for each page (130-180 ms at 100,000 open dead
	// letters, measured on the CI machine).
	countCap = 10_000
	// errorWindow is how many of a filter's latest rows the errors
	// panel groups by message.
	errorWindow = 1_000
	// errorGroups is how many distinct errors the panel shows.
	errorGroups = 10
	// knownCap bounds the consumers and topics a filter offers.
	knownCap = 200
)

// deadFilter is the /dead list's filter. The zero value lists every open
// dead letter.
type deadFilter struct {
	Consumer string
	Status   string // one of openStatuses, "" for all three
	Error    string // the exact error text, "" for any
}

func (f deadFilter) statuses() []string {
	if f.Status == "" {
		return openStatuses
	}
	return []string{f.Status}
}

func (f deadFilter) args(extra pgx.NamedArgs) pgx.NamedArgs {
	a := pgx.NamedArgs{"consumer": f.Consumer, "error": f.Error}
	for k, v := range extra {
		a[k] = v
	}
	return a
}

// deadBranches are a read's branches, one per status: each an ordered scan
// of a partial index of open dead letters in id order, which its LIMIT
// stops. The status is a literal, not a parameter: it is what proves a
// branch within the indexes' predicate, in a generic plan too. bound is a
// further condition on id ("" for none).
func deadBranches(cols string, byConsumer, byError bool, statuses []string, bound string, desc bool, limit string) []string {
	order := " ORDER BY id"
	if desc {
		order += " DESC"
	}
	return deadBranchesOrdered(cols, byConsumer, byError, statuses, bound, order, limit)
}

// deadBranchesOrdered is deadBranches with its ORDER BY clause given, ""
// for none.
func deadBranchesOrdered(cols string, byConsumer, byError bool, statuses []string, bound, order, limit string) []string {
	branches := make([]string, len(statuses))
	for i, st := range statuses {
		cond := "status = '" + st + "'"
		if byConsumer {
			cond += " AND consumer = @consumer"
		}
		if byError {
			cond += " AND error = @error"
		}
		if bound != "" {
			cond += " AND " + bound
		}
		branches[i] = "(SELECT " + cols + " FROM dead_letters WHERE " + cond + order + " LIMIT " + limit + ")"
	}
	return branches
}

// merge is branches' rows in id order, limit of them.
func merge(branches []string, desc bool, limit string) string {
	if len(branches) == 1 {
		return branches[0]
	}
	order := "id"
	if desc {
		order = "id DESC"
	}
	return `SELECT * FROM (` + strings.Join(branches, "\n\t\tUNION ALL ") + `) d ORDER BY ` + order + ` LIMIT ` + limit
}

const deadColumns = `id, consumer, message_id::text, event_type, aggregate_type, aggregate_id, aggregate_version,
		       status, reason, error, attempts, next_attempt_at, created_at`

// deadLettersQuery is a page of the /dead list: @limit rows after @after
// in id order, the statuses' branches merged. Arguments: @consumer,
// @error, @after, @limit.
func deadLettersQuery(byConsumer bool, statuses []string) string {
	return deadPageQuery(byConsumer, false, statuses, false)
}

// deadPageQuery is a page after @after, or (before) the page before
// @before, newest first (the caller reverses it).
func deadPageQuery(byConsumer, byError bool, statuses []string, before bool) string {
	bound := "id > @after"
	if before {
		bound = "id < @before"
	}
	return merge(deadBranches(deadColumns, byConsumer, byError, statuses, bound, before, "@limit"), before, "@limit")
}

// deadCountQuery counts the rows of the filter (and of bound, "" for
// none), up to @cap: each branch stops at @cap, and so does their sum.
// Unordered: each branch is an index-only scan of a partial index, which
// reads no heap page of a vacuumed table (ordered, the planner may read
// the rows and sort them).
func deadCountQuery(byConsumer, byError bool, statuses []string, bound string) string {
	return `SELECT count(*) FROM (SELECT 1 FROM (` + strings.Join(deadBranchesOrdered("id", byConsumer, byError, statuses, bound, "", "@cap"), "\n\t\tUNION ALL ") +
		`) u LIMIT @cap) c`
}

// deadStatusCountsQuery counts the filter's rows of each status, each up
// to @cap, in one statement: the page's total is their sum, and what
// "all" acts on the dead ones', from one read of each branch.
func deadStatusCountsQuery(byConsumer, byError bool, statuses []string) string {
	branches := deadBranchesOrdered("id", byConsumer, byError, statuses, "", "", "@cap")
	for i, b := range branches {
		branches[i] = "(SELECT count(*) FROM " + b + " c)"
	}
	return "SELECT " + strings.Join(branches, ", ")
}

// statusCounts reads deadStatusCountsQuery: the total, capped at limit,
// and each status's count.
func (c *Console) statusCounts(ctx context.Context, q string, args pgx.NamedArgs, statuses []string, limit int64) (capped, map[string]capped, error) {
	args["cap"] = limit + 1
	ns := make([]int64, len(statuses))
	dest := make([]any, len(statuses))
	for i := range ns {
		dest[i] = &ns[i]
	}
	if err := c.cfg.Pool.QueryRow(ctx, q, args).Scan(dest...); err != nil {
		return capped{}, nil, err
	}
	var total capped
	each := map[string]capped{}
	for i, n := range ns {
		each[statuses[i]] = capped{N: min(n, limit), Capped: n > limit}
		total.N += n
		total.Capped = total.Capped || n > limit
	}
	if total.N > limit {
		total = capped{N: limit, Capped: true}
	}
	return total, each, nil
}

// deadErrorsQuery groups the latest @window rows of the filter by error:
// the @groups most frequent.
func deadErrorsQuery(byConsumer bool, statuses []string) string {
	return `SELECT error, count(*) FROM (` + merge(deadBranches("id, error", byConsumer, false, statuses, "", true, "@window"), true, "@window") +
		`) w GROUP BY error ORDER BY count(*) DESC, error LIMIT @groups`
}

// deadMaxQuery is the newest dead letter of status dead that the filter
// matches (0 for none): the bound of an action on all of them.
func deadMaxQuery(byConsumer, byError bool) string {
	return `SELECT coalesce(max(id), 0) FROM ` + deadBranches("id", byConsumer, byError, []string{"dead"}, "", true, "1")[0] + ` m`
}

// deadActIDsQuery lists what an action on all matching the filter acts
// on: the dead letters of status dead that match, up to @through.
func deadActIDsQuery(byConsumer, byError bool) string {
	return deadBranches("id", byConsumer, byError, []string{"dead"}, "id <= @through", false, "ALL")[0]
}

// knownConsumersQuery is the consumers with open dead letters, by a skip
// scan of dead_letters_open_consumer_status_idx: one probe of the index
// per consumer, however many rows each has.
const knownConsumersQuery = `
	WITH RECURSIVE c(consumer) AS (
		(SELECT consumer FROM dead_letters WHERE status IN ('retrying', 'dead', 'held') ORDER BY consumer LIMIT 1)
		UNION ALL
		SELECT (SELECT d.consumer FROM dead_letters d
		        WHERE d.status IN ('retrying', 'dead', 'held') AND d.consumer > c.consumer ORDER BY d.consumer LIMIT 1)
		FROM c WHERE c.consumer IS NOT NULL
	)
	SELECT consumer FROM c WHERE consumer IS NOT NULL LIMIT @cap`

// parkedFilter is the /parked list's filter.
type parkedFilter struct {
	Topic string
	Error string // the exact last error, "" for any
}

func (f parkedFilter) args(extra pgx.NamedArgs) pgx.NamedArgs {
	a := pgx.NamedArgs{"topic": f.Topic, "error": f.Error}
	for k, v := range extra {
		a[k] = v
	}
	return a
}

// parkedWhere selects the parked rows of a filter (@topic, @error: ""
// for any) in outbox_failures, the small table of the rows off the
// normal path, each joined to its outbox row by the outbox's primary key.
const parkedWhere = `FROM outbox_failures f JOIN outbox o ON o.id = f.id
		WHERE f.parked_at IS NOT NULL AND (@topic::text = '' OR o.topic = @topic::text)
		  AND (@error::text = '' OR coalesce(f.last_error, '') = @error::text)`

// qParked is a page of parked rows after @after (through outbox_failures'
// primary key; o.id > @after too: whichever way the planner joins them,
// neither is read from its start).
const qParked = `
		SELECT o.id, o.message_id::text, o.topic, o.event_type, o.aggregate_type, o.aggregate_id, o.aggregate_version,
		       f.attempts, coalesce(f.last_error, ''), o.created_at, f.parked_at, f.discarded_at
		` + parkedWhere + ` AND f.id > @after AND o.id > @after
		ORDER BY f.id LIMIT @limit`

// qParkedBefore is the page before @before, newest first.
const qParkedBefore = `
		SELECT o.id, o.message_id::text, o.topic, o.event_type, o.aggregate_type, o.aggregate_id, o.aggregate_version,
		       f.attempts, coalesce(f.last_error, ''), o.created_at, f.parked_at, f.discarded_at
		` + parkedWhere + ` AND f.id < @before AND o.id < @before
		ORDER BY f.id DESC LIMIT @limit`

func parkedCountQuery(bound string) string {
	if bound != "" {
		bound = " AND " + bound
	}
	return `SELECT count(*) FROM (SELECT 1 ` + parkedWhere + bound + ` LIMIT @cap) c`
}

const (
	qParkedErrors = `SELECT e, count(*) FROM (SELECT coalesce(f.last_error, '') e ` + parkedWhere + ` ORDER BY f.id DESC LIMIT @window) w
		GROUP BY e ORDER BY count(*) DESC, e LIMIT @groups`
	qParkedMax    = `SELECT coalesce(max(f.id), 0) ` + parkedWhere
	qParkedActIDs = `SELECT f.id ` + parkedWhere + ` AND f.id <= @through ORDER BY f.id`
	// The topics of the parked rows, from the latest @cap of them.
	qParkedTopics = `SELECT DISTINCT o.topic FROM (SELECT id FROM outbox_failures WHERE parked_at IS NOT NULL ORDER BY id DESC LIMIT @cap) f
		JOIN outbox o ON o.id = f.id ORDER BY 1`
)

// capped is a count and whether it reached countCap.
type capped struct {
	N      int64
	Capped bool
}

func (c capped) String() string {
	if c.Capped {
		return thousands(c.N) + "+"
	}
	return thousands(c.N)
}

func (c *Console) countRows(ctx context.Context, q string, args pgx.NamedArgs, limit int64) (capped, error) {
	args["cap"] = limit + 1
	var n int64
	if err := c.cfg.Pool.QueryRow(ctx, q, args).Scan(&n); err != nil {
		return capped{}, err
	}
	if n > limit {
		return capped{N: limit, Capped: true}, nil
	}
	return capped{N: n}, nil
}

// errorGroup is one error of a list's filter and how many of its latest
// rows have it.
type errorGroup struct {
	Error string
	Count int64
}

func (c *Console) readErrorGroups(ctx context.Context, q string, args pgx.NamedArgs) ([]errorGroup, error) {
	args["window"], args["groups"] = errorWindow, errorGroups
	rows, err := c.cfg.Pool.Query(ctx, q, args)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[errorGroup])
}

// knownConsumers are the consumers a /dead filter offers: the configured
// ones, then those with open dead letters, each once, sorted.
func (c *Console) knownConsumers(ctx context.Context) ([]string, error) {
	rows, err := c.cfg.Pool.Query(ctx, knownConsumersQuery, pgx.NamedArgs{"cap": knownCap})
	if err != nil {
		return nil, fmt.Errorf("list consumers of dead letters: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list consumers of dead letters: %w", err)
	}
	for _, cs := range c.cfg.Consumers {
		names = append(names, cs.Name)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// knownTopics are the topics a /parked filter offers: those of parked
// rows and the configured consumers'.
func (c *Console) knownTopics(ctx context.Context) ([]string, error) {
	rows, err := c.cfg.Pool.Query(ctx, qParkedTopics, pgx.NamedArgs{"cap": countCap})
	if err != nil {
		return nil, fmt.Errorf("list topics of parked rows: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list topics of parked rows: %w", err)
	}
	for _, cs := range c.cfg.Consumers {
		names = append(names, cs.Topic)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) > knownCap {
		names = names[:knownCap]
	}
	return names, nil
}

// resolveName matches a filter's value against the known values: as
// given when it is one of them; case-insensitively when that finds exactly
// one (a pasted "Sync-Analytics" lists sync-analytics, and says so);
// otherwise as given, with a hint naming the values it may have meant, so
// that an empty list is never silent about a typo.
func resolveName(kind, v string, known []string) (value, note, hint string) {
	if v == "" || slices.Contains(known, v) {
		return v, "", ""
	}
	var folded []string
	for _, k := range known {
		if strings.EqualFold(k, v) {
			folded = append(folded, k)
		}
	}
	if len(folded) == 1 {
		return folded[0], fmt.Sprintf("No %s is named %q: showing %s (names are case-sensitive).", kind, v, folded[0]), ""
	}
	if len(folded) == 0 {
		for _, k := range known {
			lk, lv := strings.ToLower(k), strings.ToLower(v)
			if strings.Contains(lk, lv) || strings.Contains(lv, lk) {
				folded = append(folded, k)
			}
		}
	}
	if len(folded) > 0 {
		return v, "", fmt.Sprintf("No %s named %q; did you mean %s?", kind, v, strings.Join(folded, " or "))
	}
	if len(known) == 0 {
		return v, "", fmt.Sprintf("No %s named %q, and none is known.", kind, v)
	}
	return v, "", fmt.Sprintf("No %s named %q; the known ones are %s.", kind, v, strings.Join(known, ", "))
}
