package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/internal/actionlog"
	"github.com/outflow-dev/outflow/replay"
)

// replayEntry is the record of a replay: the consumer and the filter, in
// the console's shape for one aggregate (consumer, aggregate_type,
// aggregate_id: that aggregate's journey lists it).
func replayEntry(consumerName string, f replay.Filter, all bool) actionlog.Entry {
	t := aggregateTarget{Consumer: consumerName, AggregateType: f.AggregateType, EventTypes: f.EventTypes, All: all, Source: f.Source}
	var oneType, oneID string
	t.AggregateIDs, t.MoreIDs, oneType, oneID = aggregatesTarget(f.AggregateType, f.AggregateIDs)
	if oneID != "" {
		t.AggregateID, t.AggregateIDs = oneID, nil
	}
	if !f.Since.IsZero() {
		t.Since = f.Since.UTC().Format(time.RFC3339)
	}
	if !f.Until.IsZero() {
		t.Until = f.Until.UTC().Format(time.RFC3339)
	}
	return actionlog.Entry{Action: "replay", Target: t, AggregateType: oneType, AggregateID: oneID}
}

// resetEntry is the record of a consumer reset.
func resetEntry(consumerName, aggType string, ids []string, all, projection bool) actionlog.Entry {
	t := aggregateTarget{Consumer: consumerName, AggregateType: aggType, AllAggregates: all, ProjectionSQL: projection}
	var oneType, oneID string
	t.AggregateIDs, t.MoreIDs, oneType, oneID = aggregatesTarget(aggType, ids)
	if oneID != "" {
		t.AggregateID, t.AggregateIDs = oneID, nil
	}
	return actionlog.Entry{Action: "consumer.reset", Target: t, AggregateType: oneType, AggregateID: oneID}
}

// aggregateTarget is what a replay or a reset records. The SQL of
// --projection-sql is in the record's command line, not here.
type aggregateTarget struct {
	Consumer      string   `json:"consumer"`
	AggregateType string   `json:"aggregate_type,omitempty"`
	AggregateID   string   `json:"aggregate_id,omitempty"`
	AggregateIDs  []string `json:"aggregate_ids,omitempty"`
	MoreIDs       int      `json:"more_ids,omitempty"`
	AllAggregates bool     `json:"all_aggregates,omitempty"`
	EventTypes    []string `json:"event_types,omitempty"`
	Since         string   `json:"since,omitempty"`
	Until         string   `json:"until,omitempty"`
	All           bool     `json:"all,omitempty"`
	Source        string   `json:"source,omitempty"`
	ProjectionSQL bool     `json:"projection_sql,omitempty"`
}

// replayTarget finds the consumer a replay or reset names: one of the
// handlers `outflow worker` runs, whose topic it knows, or a consumer of
// another service, whose topic --topic gives (the tool runs no code of
// that service). needTopic is false for a reset, which reads no topic.
func replayTarget(name, topic string, needTopic bool) (consumer.Handler, error) {
	hs := referenceHandlers(nil, handlers.NotifyConfig{})
	var names []string
	for _, h := range hs {
		if h.Name == name {
			if h.NoReplay {
				return h, fmt.Errorf("invalid --consumer: %q does not read a replay topic (NoReplay)", name)
			}
			if topic != "" && topic != h.Topic {
				return h, fmt.Errorf("invalid --topic: %s reads %q, not %q", name, h.Topic, topic)
			}
			return h, nil
		}
		names = append(names, h.Name)
	}
	switch {
	case name == "":
		return consumer.Handler{}, fmt.Errorf("invalid --consumer: required (the reference app's: %s; or a consumer of yours, with --topic)", strings.Join(names, ", "))
	case strings.TrimSpace(name) != name || strings.ContainsAny(name, " \t\n"):
		return consumer.Handler{}, fmt.Errorf("invalid --consumer: %q has white space", name)
	case topic == "" && needTopic:
		return consumer.Handler{}, fmt.Errorf("invalid --topic: required for %q, which is not one of the reference app's consumers (%s): the topic that consumer reads",
			name, strings.Join(names, ", "))
	}
	return consumer.Handler{Name: name, Topic: topic}, nil
}

// knownConsumer refuses a reset of a consumer with no bookkeeping in the
// database: any name is taken (a service's consumers are not known to the
// tool), so a misspelt one would otherwise reset nothing and say so
// quietly. The error lists the consumers that have some.
func knownConsumer(ctx context.Context, pool *pgxpool.Pool, name string) error {
	var known bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM consumer_aggregate_versions WHERE consumer = $1)
		OR EXISTS (SELECT 1 FROM dead_letters WHERE consumer = $1)`, name).Scan(&known); err != nil {
		return fmt.Errorf("look up consumer %q: %w", name, err)
	}
	if known {
		return nil
	}
	// A loose index scan: one probe per consumer, however many rows each
	// has.
	rows, err := pool.Query(ctx, `
		WITH RECURSIVE c(name) AS (
			(SELECT consumer FROM consumer_aggregate_versions ORDER BY consumer LIMIT 1)
			UNION ALL
			SELECT (SELECT consumer FROM consumer_aggregate_versions WHERE consumer > c.name ORDER BY consumer LIMIT 1)
			FROM c WHERE c.name IS NOT NULL)
		SELECT name FROM c WHERE name IS NOT NULL LIMIT 20`)
	if err != nil {
		return fmt.Errorf("list consumers: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("list consumers: %w", err)
	}
	have := "none has any yet"
	if len(names) > 0 {
		have = "those that have some: " + strings.Join(names, ", ")
	}
	return fmt.Errorf("invalid --consumer: %q has no bookkeeping in this database, nothing to reset (%s)", name, have)
}

// aggregateFlags are the aggregate choice shared by replay and reset.
type aggregateFlags struct {
	aggregateType string
	ids           []string
	idsFrom       string
}

func (a *aggregateFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&a.aggregateType, "aggregate-type", "", "the aggregates' type")
	cmd.Flags().StringArrayVar(&a.ids, "aggregate-id", nil, "an aggregate id (repeat the flag for more)")
	cmd.Flags().StringVar(&a.idsFrom, "aggregate-ids-from", "", "a file of aggregate ids, one per line ('-': standard input)")
}

// load reads --aggregate-ids-from into ids and checks the pair.
func (a *aggregateFlags) load(stdin io.Reader) error {
	if a.idsFrom != "" {
		r := stdin
		if a.idsFrom != "-" {
			f, err := os.Open(a.idsFrom)
			if err != nil {
				return fmt.Errorf("invalid --aggregate-ids-from: %w", err)
			}
			defer f.Close()
			r = f
		}
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if id := strings.TrimSpace(sc.Text()); id != "" {
				a.ids = append(a.ids, id)
			}
		}
		if err := sc.Err(); err != nil {
			return fmt.Errorf("invalid --aggregate-ids-from: %w", err)
		}
		if len(a.ids) == 0 {
			return fmt.Errorf("invalid --aggregate-ids-from: %s holds no aggregate id", a.idsFrom)
		}
	}
	if slices.ContainsFunc(a.ids, func(id string) bool { return strings.TrimSpace(id) == "" }) {
		return errors.New("invalid --aggregate-id: empty")
	}
	if len(a.ids) > 0 && a.aggregateType == "" {
		return errors.New("invalid --aggregate-id: needs --aggregate-type")
	}
	return nil
}

// confirm asks on a terminal; elsewhere it returns ok=false and the caller
// decides.
func confirm(cmd *cobra.Command, question string) (answered, yes bool) {
	f, ok := cmd.InOrStdin().(*os.File)
	if !ok || !isTerminal(f) {
		return false, false
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s [y/N] ", question)
	line, _ := bufio.NewReader(f).ReadString('\n')
	a := strings.ToLower(strings.TrimSpace(line))
	return true, a == "y" || a == "yes"
}

func parseTime(flag, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("invalid --%s: %q is not an RFC 3339 time (2026-01-02T15:04:05Z)", flag, v)
	}
	return t, nil
}

func newReplayCmd(e *env) *cobra.Command {
	var (
		name, since, until string
		topic              string
		source             string
		agg                aggregateFlags
		eventTypes         []string
		all, dryRun, yes   bool
		partitions         int
		batchSize          int
		target             consumer.Handler
		f                  replay.Filter
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Re-deliver retained outbox rows to one consumer (others untouched; what it handled is skipped)",
		Long: `Publishes the retained, published outbox rows the filters choose, in id order, to the consumer's
replay topic (outflow.replay.<consumer>), which only that consumer's group reads, through its
idempotency: what it already handled is skipped, so a replay re-applies an event only after
'outflow consumer reset' made the consumer forget it. See docs/replay.md.`,
		Args: cobra.NoArgs,
		RunE: e.withPool(func() error {
			var err error
			if target, err = replayTarget(name, topic, true); err != nil {
				return err
			}
			if err := agg.load(os.Stdin); err != nil {
				return err
			}
			if slices.Contains(eventTypes, "") {
				return errors.New("invalid --event-type: empty")
			}
			if partitions < 1 || partitions > 1024 {
				return errors.New("invalid --stream-partitions: must be between 1 and 1024")
			}
			if batchSize < 1 || batchSize > 10000 {
				return errors.New("invalid --batch-size: must be between 1 and 10000")
			}
			f = replay.Filter{AggregateType: agg.aggregateType, AggregateIDs: agg.ids, EventTypes: eventTypes}
			if source != replay.SourceOutbox && source != replay.SourceWALHistory {
				return fmt.Errorf("invalid --source: %q (%s or %s)", source, replay.SourceOutbox, replay.SourceWALHistory)
			}
			if f.Since, err = parseTime("since", since); err != nil {
				return err
			}
			if f.Until, err = parseTime("until", until); err != nil {
				return err
			}
			if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
				return errors.New("invalid --since/--until: --since must be before --until")
			}
			chosen := f.Validate() == nil // without Topic: did the operator choose anything?
			switch {
			case !chosen && !all:
				return errors.New("invalid flags: choose rows with --aggregate-type, --aggregate-id, --event-type, --since or --until, or give --all to replay every retained row")
			case chosen && all:
				return errors.New("invalid --all: it excludes the other filters")
			}
			// The consumer reads its topic only: rows of other topics are not
			// its events.
			f.Topic = target.Topic
			f.Source = source
			return nil
		}, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			n, err := replay.Count(ctx, pool, f)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%d outbox row(s) chosen for %s (%s)\n", n, target.Name, f)
			if dryRun || n == 0 {
				if dryRun {
					fmt.Fprintln(out, "dry run: nothing published")
				}
				return nil
			}
			if !yes {
				if answered, ok := confirm(cmd, fmt.Sprintf("Replay %d row(s) to %s?", n, target.Name)); answered && !ok {
					fmt.Fprintln(out, "nothing published")
					return nil
				}
			}
			// Published to a broker, not in a transaction: recorded after,
			// with what it published; the audit is checked first.
			if err := actionlog.Ready(ctx, pool); err != nil {
				return err
			}
			cfg, logger, err := e.load()
			if err != nil {
				return err
			}
			app, err := appInstalled(ctx, pool)
			if err != nil {
				return err
			}
			backend, err := brokers.Open(ctx, brokerConfig(cfg, partitions, logger, app))
			if err != nil {
				return err
			}
			defer backend.Close()
			// Nothing trims a replay topic but this: what earlier replays
			// left and the consumer acknowledged goes now (Redis streams).
			if tt, ok := backend.(brokers.TopicTrimmer); ok {
				if _, err := tt.TrimTopic(ctx, consumer.ReplayTopic(target.Name)); err != nil {
					logger.Warn("trim the replay topic", "topic", consumer.ReplayTopic(target.Name), "error", err.Error())
				}
			}
			published, err := replay.Publish(ctx, pool, backend.Broker(), target.Name, f, replay.Options{BatchSize: batchSize})
			fmt.Fprintf(out, "published %d of %d row(s) to %s\n", published, n, consumer.ReplayBrokerTopic(backend, target.Name))
			err = e.recordAfter(cmd, nil, pool, replayEntry(target.Name, f, all), published, err)
			if err != nil {
				return fmt.Errorf("%w (running the same replay again is safe: the consumer skips what it handled)", err)
			}
			return nil
		}),
	}
	cmd.Flags().StringVar(&name, "consumer", "", "the consumer to replay to: one of the reference app's, or one of yours with --topic")
	cmd.Flags().StringVar(&topic, "topic", "", "the topic the consumer reads (required for a consumer that is not the reference app's)")
	agg.register(cmd)
	cmd.Flags().StringArrayVar(&eventTypes, "event-type", nil, "an event type (repeat the flag for more)")
	cmd.Flags().StringVar(&since, "since", "", "events that occurred at or after this time (RFC 3339)")
	cmd.Flags().StringVar(&until, "until", "", "events that occurred before this time (RFC 3339)")
	cmd.Flags().BoolVar(&all, "all", false, "replay every retained row of the consumer's topic (no other filter)")
	cmd.Flags().StringVar(&source, "source", replay.SourceOutbox, "where the events are read: outbox (table mode) or wal_history (WAL mode's relay history)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "count the rows, publish nothing")
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	cmd.Flags().IntVar(&partitions, "stream-partitions", 1, "streams per topic (the forwarder's and the workers' value)")
	cmd.Flags().IntVar(&batchSize, "batch-size", replay.DefaultBatchSize, "rows per read and per publish")
	return cmd
}

func newConsumerCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "consumer",
		Short: "Manage a consumer's bookkeeping",
	}
	var (
		name, projectionSQL string
		agg                 aggregateFlags
		allAggregates, yes  bool
		target              consumer.Handler
	)
	reset := &cobra.Command{
		Use:   "reset",
		Short: "Make one consumer forget aggregates (versions, open dead letters), for a replay",
		Long: `Sets, in one transaction, the consumer's aggregate versions back to 0, marked reset, and deletes
its open dead letters of them (and any processed_messages rows of their retained outbox rows,
which consumers before migration 00026 wrote): their history starts again at version 1, never at
a baseline (BaselineBefore); --projection-sql
runs in the same transaction, after the aggregates are locked against the consumer: delete the
projection's own rows there. Then 'outflow replay' applies their events again. Aggregates whose
first versions the outbox no longer holds are named: a replay cannot rebuild them. See docs/replay.md.`,
		Args: cobra.NoArgs,
		RunE: e.withPool(func() error {
			var err error
			if target, err = replayTarget(name, "", false); err != nil {
				return err
			}
			if err := agg.load(os.Stdin); err != nil {
				return err
			}
			switch {
			case agg.aggregateType == "":
				return errors.New("invalid --aggregate-type: required")
			case allAggregates && len(agg.ids) > 0:
				return errors.New("invalid --all-aggregates: give --aggregate-id or --all-aggregates, not both")
			case !allAggregates && len(agg.ids) == 0:
				return errors.New("invalid flags: give --aggregate-id (or --aggregate-ids-from) or --all-aggregates")
			}
			return nil
		}, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
			out := cmd.OutOrStdout()
			if err := knownConsumer(cmd.Context(), pool, target.Name); err != nil {
				return err
			}
			what := fmt.Sprintf("%d aggregate(s) of type %s", len(agg.ids), agg.aggregateType)
			if allAggregates {
				what = "every aggregate of type " + agg.aggregateType
			}
			if !yes {
				answered, ok := confirm(cmd, fmt.Sprintf("Make %s forget %s?", target.Name, what))
				switch {
				case !answered:
					return errors.New("invalid flags: not on a terminal: give --yes to reset")
				case !ok:
					fmt.Fprintln(out, "nothing changed")
					return nil
				}
			}
			r := replay.Reset{Consumer: target.Name, AggregateType: agg.aggregateType, AggregateIDs: agg.ids,
				AllAggregates: allAggregates}
			var projected int64
			entry := resetEntry(target.Name, agg.aggregateType, agg.ids, allAggregates, projectionSQL != "")
			entry.Actor = e.actor(cmd, nil)
			// The record is written in the reset's transaction, after the
			// projection's SQL: the reset and its record commit together.
			r.Also = func(ctx context.Context, tx pgx.Tx) error {
				if projectionSQL != "" {
					ct, err := tx.Exec(ctx, projectionSQL, pgx.QueryExecModeSimpleProtocol)
					projected = ct.RowsAffected()
					if err != nil {
						return err
					}
				}
				// The aggregates this transaction marked: reset_at is its
				// start, now(), by the primary key's prefix.
				if err := tx.QueryRow(ctx, `SELECT count(*) FROM consumer_aggregate_versions
					WHERE consumer = $1 AND aggregate_type = $2 AND reset_at = now() AND ($3::text[] IS NULL OR aggregate_id = ANY($3::text[]))`,
					target.Name, agg.aggregateType, agg.ids).Scan(&entry.Count); err != nil {
					return fmt.Errorf("count the aggregates reset: %w", err)
				}
				_, err := actionlog.Insert(ctx, tx, entry)
				return err
			}
			res, err := replay.ResetConsumer(cmd.Context(), pool, r)
			if err != nil {
				// Nothing was reset: the failure is recorded alone.
				return e.recordAfter(cmd, nil, pool, entry, 0, err)
			}
			fmt.Fprintf(out, "%s forgot %s: %d aggregate version(s), %d open dead letter(s)", target.Name, what, res.Versions, res.DeadLetters)
			if res.Processed > 0 { // rows consumers wrote before migration 00026; none since
				fmt.Fprintf(out, ", %d processed_messages row(s) from before migration 00026", res.Processed)
			}
			fmt.Fprintln(out)
			if res.Purged > 0 {
				// Said now, not only when their gaps time out: the
				// operator chose these aggregates and can still act.
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: the outbox no longer holds the first versions of %d aggregate(s) (%s%s): "+
					"a replay cannot rebuild them; %s waits for their missing versions and dead-letters their next event "+
					"after its gap timeout (see docs/replay.md)\n",
					res.Purged, strings.Join(res.PurgedIDs, ", "), more(res.Purged, len(res.PurgedIDs)), target.Name)
			}
			if projectionSQL != "" {
				fmt.Fprintf(out, "--projection-sql: %d row(s)\n", projected)
			}
			return nil
		}),
	}
	reset.Flags().StringVar(&name, "consumer", "", "the consumer to reset: the reference app's, or any consumer of yours by its name")
	agg.register(reset)
	reset.Flags().BoolVar(&allAggregates, "all-aggregates", false, "every aggregate of --aggregate-type (pauses every consumer's bookkeeping while it runs)")
	reset.Flags().StringVar(&projectionSQL, "projection-sql", "", "SQL run in the reset's transaction: delete the projection's rows of these aggregates")
	reset.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	cmd.AddCommand(reset)
	return cmd
}

// more says how many of n a list of shown names leaves out.
func more(n int64, shown int) string {
	if left := n - int64(shown); left > 0 {
		return fmt.Sprintf(" and %d more", left)
	}
	return ""
}
