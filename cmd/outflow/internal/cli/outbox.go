package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/actionlog"
)

// repartitionTarget is what `outbox repartition` records.
type repartitionTarget struct {
	Partitions int   `json:"partitions"`
	Offline    bool  `json:"offline,omitempty"`
	FromID     int64 `json:"from_id,omitempty"` // online: the first id of the new partitions
}

func newOutboxCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "Inspect and release parked outbox rows (nothing is ever deleted)",
	}
	var (
		limit        int
		parkedAsJSON bool
	)
	parked := &cobra.Command{
		Use:   "parked",
		Short: "List rows parked after max attempts, with their last error",
		Args:  cobra.NoArgs,
		RunE: e.withPool(func() error {
			if limit < 1 {
				return errors.New("invalid --limit: must be at least 1")
			}
			return nil
		}, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
			rows, err := forwarder.ListParked(cmd.Context(), pool, limit)
			if err != nil {
				return err
			}
			if parkedAsJSON {
				return printList(cmd, rows)
			}
			out := cmd.OutOrStdout()
			if len(rows) == 0 {
				fmt.Fprintln(out, "no parked rows")
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tMESSAGE ID\tEVENT\tAGGREGATE\tVERSION\tATTEMPTS\tPARKED AT\tDISCARDED AT\tLAST ERROR")
			discarded := false
			for _, r := range rows {
				at := "-"
				if r.DiscardedAt != nil {
					at, discarded = r.DiscardedAt.Format(time.RFC3339), true
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s/%s\t%d\t%d\t%s\t%s\t%s\n", r.ID, r.MessageID, r.EventType, r.AggregateType,
					r.AggregateID, r.AggregateVersion, r.Attempts, r.ParkedAt.Format(time.RFC3339), at, r.LastError)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if discarded {
				// Otherwise an operator retrying such a row expects its event.
				fmt.Fprintln(out, "A row with DISCARDED AT was discarded, then parked again: what failed is its discard marker "+
					"(event type "+events.EventTypeDiscarded+"), and `outbox retry` sends the marker again, not the event.")
			}
			return nil
		}),
	}
	parked.Flags().IntVar(&limit, "limit", 100, "rows to list")
	parked.Flags().BoolVar(&parkedAsJSON, "json", false, "print a JSON array of the rows")

	retry := releaseCmd("retry", "Put parked rows back in line with a fresh attempt count: --id N or --all [--topic T]", "",
		"released", false, e, forwarder.RetryParked)
	discard := releaseCmd("discard", "Give up on parked rows, a discard marker going out in place of each: --id N or --all [--topic T]",
		"Each row is released and marked discarded; the forwarder publishes a discard marker in its place (event type "+
			events.EventTypeDiscarded+", the same message id and aggregate version, an empty payload). Consumers record it "+
			"without running their handler, and the aggregate's later events flow after it. The row is kept. "+
			"--all asks first on a terminal; elsewhere it needs --yes.",
		"discarded", true, e, forwarder.DiscardParked)

	var (
		partitions int
		liveWithin time.Duration
		offline    bool
	)
	repartition := &cobra.Command{
		Use:   "repartition",
		Short: "Change the forwarder's partition count, with the forwarders running",
		Long: "Rows from the next id on map to the new partitions, which take over once every row of the old ones is " +
			"published: each aggregate's events stay in order across the change, new events wait meanwhile (about two " +
			"lease intervals). --offline changes it at once, and is refused while any forwarder runs.",
		Args: cobra.NoArgs,
		RunE: e.withPool(func() error {
			if partitions < 1 || partitions > 4096 {
				return errors.New("invalid --partitions: must be between 1 and 4096")
			}
			if liveWithin < time.Second {
				return errors.New("invalid --takeover-after: must be at least 1s")
			}
			return nil
		}, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
			// The forwarder's functions commit the change themselves: it
			// is recorded after, with its outcome.
			if err := actionlog.Ready(cmd.Context(), pool); err != nil {
				return err
			}
			target := repartitionTarget{Partitions: partitions, Offline: offline}
			entry := actionlog.Entry{Action: "outbox.repartition", Target: &target}
			if offline {
				err := forwarder.Repartition(cmd.Context(), pool, partitions, liveWithin)
				if err := e.recordAfter(cmd, nil, pool, entry, done(err, partitions), err); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "the outbox now has %d partitions\n", partitions)
				return nil
			}
			from, err := forwarder.RepartitionOnline(cmd.Context(), pool, partitions)
			target.FromID = from
			if err := e.recordAfter(cmd, nil, pool, entry, done(err, partitions), err); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "rows from id %d on map to %d partitions; they take over once the rows below are published\n", from, partitions)
			return nil
		}),
	}
	repartition.Flags().IntVar(&partitions, "partitions", 0, "the new partition count")
	repartition.Flags().BoolVar(&offline, "offline", false, "change it at once, every forwarder stopped")
	repartition.Flags().DurationVar(&liveWithin, "takeover-after", 10*time.Second,
		"with --offline, the forwarders' --takeover-after: a forwarder whose last heartbeat is older counts as stopped")
	cmd.AddCommand(parked, retry, discard, repartition)
	return cmd
}

// releaseCmd is `outbox retry` or `outbox discard`: the same flags, the
// same checks, release applied to the rows they choose; done is the verb
// of its output. With askAll, --all asks first, or needs --yes off a
// terminal, as `consumer reset` does: a discard of every parked row cannot
// be taken back, a retry can be left to fail again.
func releaseCmd(name, short, long, done string, askAll bool, e *env,
	release func(context.Context, forwarder.Querier, forwarder.ParkedFilter) (int64, error),
) *cobra.Command {
	var (
		id    int64
		all   bool
		yes   bool
		topic string
		cmd   *cobra.Command
	)
	cmd = &cobra.Command{
		Use:   name,
		Short: short,
		Long:  long,
		Args:  cobra.NoArgs,
		RunE: e.withPool(func() error {
			if err := checkIDOrAll(id, all, "a parked row's id (see `outflow outbox parked`)"); err != nil {
				return err
			}
			// A blank --topic would choose every topic: `--all --topic "$T"`
			// with T unset must not act on every parked row.
			if cmd.Flags().Changed("topic") && strings.TrimSpace(topic) == "" {
				return errors.New("invalid --topic: must not be blank (leave it out to choose every topic)")
			}
			return nil
		}, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
			if askAll && all && !yes {
				what := "every parked row"
				if topic != "" {
					what = fmt.Sprintf("every parked row of topic %q", topic)
				}
				answered, ok := confirm(cmd, fmt.Sprintf("%s %s?", strings.ToUpper(name[:1])+name[1:], what))
				switch {
				case !answered:
					return fmt.Errorf("invalid flags: not on a terminal: give --yes to %s --all", name)
				case !ok:
					fmt.Fprintln(cmd.OutOrStdout(), "nothing changed")
					return nil
				}
			}
			target := idsOrAll(id, all)
			if all {
				target.Topic = topic
			}
			// An --id that is not parked fails the action, which is
			// recorded as such: it changed nothing.
			n, err := e.recorded(cmd, nil, pool, actionlog.Entry{Action: "outbox." + name, Target: target},
				func(ctx context.Context, tx pgx.Tx) (int64, error) {
					n, err := release(ctx, tx, forwarder.ParkedFilter{ID: id, Topic: topic})
					if err != nil || n > 0 || all {
						return n, err
					}
					if topic != "" {
						return 0, fmt.Errorf("invalid --id: row %d is not a parked row of topic %q", id, topic)
					}
					return 0, fmt.Errorf("invalid --id: row %d is not parked", id)
				})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %d parked rows\n", done, n)
			return nil
		}),
	}
	cmd.Flags().Int64Var(&id, "id", 0, "the parked row to "+name)
	cmd.Flags().BoolVar(&all, "all", false, name+" every parked row (of --topic, when given)")
	cmd.Flags().StringVar(&topic, "topic", "", "only rows of this outbox topic")
	if askAll {
		cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation of --all")
	}
	return cmd
}

// checkIDOrAll validates the --id N | --all pair of the retry commands.
func checkIDOrAll(id int64, all bool, what string) error {
	switch {
	case all && id != 0:
		return errors.New("invalid flags: give --id or --all, not both")
	case !all && id <= 0:
		return fmt.Errorf("invalid --id: give %s, or --all", what)
	}
	return nil
}

// done is the partitions a repartition created: none when it failed.
func done(err error, partitions int) int64 {
	if err != nil {
		return 0
	}
	return int64(partitions)
}
