package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/cmd/outflow/internal/config"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/handlers"
	"github.com/outflow-dev/outflow/idempotency"
)

// consumerStats is one consumer's line of `outflow stats`.
type consumerStats struct {
	Topic string `json:"topic,omitempty"`
	// Lag and OldestUnhandledAgeSeconds are null when the broker does
	// not report lag (or could not be reached).
	Lag                       *int64   `json:"lag"`
	OldestUnhandledAgeSeconds *float64 `json:"oldest_unhandled_age_seconds"`
	idempotency.DeadLetterCounts
}

type stats struct {
	Outbox    forwarder.Stats          `json:"outbox"`
	Consumers map[string]consumerStats `json:"consumers"`
	// Webhooks is nil (null in JSON) on a database without the reference
	// app's tables: another service's, whose webhooks are not ours.
	Webhooks *webhookStats `json:"webhooks"`
	// Audit is the broker audit's record per broker topic ([] where no
	// audit ran).
	Audit []forwarder.AuditState `json:"audit"`
}

// webhookStats counts the merchants' webhook deliveries not delivered.
type webhookStats struct {
	// Pending deliveries wait for their first or next attempt: the
	// webhook package's, and the legacy ones an earlier release left that
	// the handover has not moved yet.
	Pending int64 `json:"pending"`
	// Failing ones are pending after at least one failed attempt.
	Failing int64 `json:"failing"`
	// Dead ones were given up ('failed': the schedule ran out, a 4xx, or
	// the endpoint was disabled), until resent, recovered or purged.
	Dead int64 `json:"dead"`
}

// webhookStatsQuery counts one status at a time, so that each count reads
// a partial index (the due and the settled ones) rather than every
// delivery. The legacy table's pending rows count too while the handover
// (handlers.RunHandOver) moves them; its dead ones were the previous
// release's, and stay out of the count.
const webhookStatsQuery = `
	SELECT (SELECT count(*) FROM webhook_endpoint_deliveries WHERE status = 'pending')
	       + (SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'),
	       (SELECT count(*) FROM webhook_endpoint_deliveries WHERE status = 'pending' AND attempts > 0)
	       + (SELECT count(*) FROM webhook_deliveries WHERE status = 'pending' AND attempts > 0),
	       (SELECT count(*) FROM webhook_endpoint_deliveries WHERE status = 'failed')`

func readWebhookStats(ctx context.Context, pool *pgxpool.Pool) (webhookStats, error) {
	var s webhookStats
	if err := pool.QueryRow(ctx, webhookStatsQuery).Scan(&s.Pending, &s.Failing, &s.Dead); err != nil {
		return s, fmt.Errorf("webhook stats: %w", err)
	}
	return s, nil
}

func readStats(ctx context.Context, pool *pgxpool.Pool, c config.Config, partitions int, logger *slog.Logger) (stats, error) {
	var (
		s   stats
		err error
	)
	if s.Outbox, err = forwarder.ReadStats(ctx, pool); err != nil {
		return s, err
	}
	if s.Audit, err = forwarder.ReadAuditStates(ctx, pool); err != nil {
		return s, err
	}
	if s.Audit == nil {
		s.Audit = []forwarder.AuditState{}
	}
	app, err := appInstalled(ctx, pool)
	if err != nil {
		return s, err
	}
	if app {
		w, err := readWebhookStats(ctx, pool)
		if err != nil {
			return s, err
		}
		s.Webhooks = &w
	}
	parked, err := idempotency.ReadDeadLetterCounts(ctx, pool)
	if err != nil {
		return s, err
	}
	s.Consumers = map[string]consumerStats{}
	for name, p := range parked {
		s.Consumers[name] = consumerStats{DeadLetterCounts: p}
	}
	// Asking must leave the broker as it was: opening a built-in backend
	// declares nothing (streams, queues, topics and tables are made by the
	// first publish or subscription), and every built-in LagReporter only
	// reads, so stats creates no stream, queue, consumer or offsets row for
	// a consumer that never ran. A backend without lag prints null.
	var lr brokers.LagReporter
	backend, err := brokers.Open(ctx, c.BrokerConfig(partitions, logger))
	if err != nil {
		// The database's numbers are worth printing without the lag.
		logger.Warn("consumer lag unknown: broker unreachable", "broker", string(c.Broker), "error", err.Error())
	} else {
		defer backend.Close()
		lr, _ = backend.(brokers.LagReporter)
	}
	var reference []consumer.Handler
	if app { // the reference consumers run only where their tables are
		reference = referenceHandlers(nil, handlers.NotifyConfig{})
	}
	for _, h := range reference {
		cs := s.Consumers[h.Name]
		cs.Topic = h.Topic
		if lr != nil {
			lag, err := lr.Lag(ctx, h.Name, h.Topic)
			if err != nil {
				logger.Warn("consumer lag unknown", "consumer", h.Name, "error", err.Error())
			} else {
				age := lag.OldestAge.Seconds()
				cs.Lag, cs.OldestUnhandledAgeSeconds = &lag.Events, &age
			}
		}
		s.Consumers[h.Name] = cs
	}
	return s, nil
}

func newStatsCmd(e *env) *cobra.Command {
	var (
		asJSON     bool
		partitions int
	)
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Print the outbox's, the consumers' and the webhooks' backlog (pending, parked, lag, dead) and the broker audit's record",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if partitions < 1 || partitions > 1024 {
				return errors.New("invalid --stream-partitions: must be between 1 and 1024")
			}
			cfg, logger, err := e.load()
			if err != nil {
				return err
			}
			pool, err := openPool(cmd.Context(), cfg.DatabaseURL)
			if err != nil {
				return err
			}
			defer pool.Close()
			s, err := readStats(cmd.Context(), pool, cfg, partitions, logger)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(s)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "pending\t%d\n", s.Outbox.Pending)
			fmt.Fprintf(tw, "parked\t%d\n", s.Outbox.Parked)
			fmt.Fprintf(tw, "oldest pending age\t%s\n", seconds(s.Outbox.OldestPendingAgeSeconds))
			fmt.Fprintf(tw, "published total\t%d\n", s.Outbox.PublishedTotal)
			if s.Webhooks != nil {
				fmt.Fprintf(tw, "webhooks pending\t%d\n", s.Webhooks.Pending)
				fmt.Fprintf(tw, "webhooks failing\t%d\n", s.Webhooks.Failing)
				fmt.Fprintf(tw, "webhooks dead\t%d\n", s.Webhooks.Dead)
			} else {
				fmt.Fprintln(tw, "webhooks\tnot installed (the reference app's tables are not in this database)")
			}
			fmt.Fprintln(tw, "\nCONSUMER\tTOPIC\tLAG\tOLDEST UNHANDLED\tHELD\tRETRYING\tDEAD")
			for _, name := range slices.Sorted(maps.Keys(s.Consumers)) {
				cs := s.Consumers[name]
				lag, age := "-", "-"
				if cs.Lag != nil {
					lag, age = fmt.Sprint(*cs.Lag), seconds(*cs.OldestUnhandledAgeSeconds).String()
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\n", name, orDash(cs.Topic), lag, age, cs.Held, cs.Retrying, cs.Dead)
			}
			if len(s.Audit) == 0 {
				fmt.Fprintln(tw, "\nbroker audit\tnot run yet (every --audit-interval, by the forwarder holding partition 0, on a broker that keeps receipts: Redis, NATS, Kafka)")
				return tw.Flush()
			}
			fmt.Fprintln(tw, "\nAUDITED BROKER TOPIC\tMODE\tLAST CHECKED\tLAST LOSS\tREPAIRED")
			now := time.Now()
			for _, a := range s.Audit {
				loss := "none"
				if a.LastLossAt != nil {
					loss = seconds(now.Sub(*a.LastLossAt).Seconds()).String() + " ago"
					if a.LastLossReason != nil {
						loss += ": " + *a.LastLossReason
					}
				}
				fmt.Fprintf(tw, "%s\t%s\t%s ago\t%s\t%d\n", a.BrokerTopic, a.Mode, seconds(now.Sub(a.AuditedAt).Seconds()), loss, a.LastRepaired)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false,
		`print {"outbox": {...}, "consumers": {"<name>": {"topic", "lag", "oldest_unhandled_age_seconds", "held", "retrying", "dead"}}, "webhooks": {"pending", "failing", "dead"}, "audit": [{"mode", "broker_topic", "topic", "audited_at", "last_loss_at", "last_loss_reason", "last_repaired"}]} (lag null where the broker does not report it; webhooks null where the reference app's tables are not installed)`)
	cmd.Flags().IntVar(&partitions, "stream-partitions", 1, "streams per topic (the forwarder's value), for the consumers' lag")
	return cmd
}

func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond)
}

// printList writes rows as a JSON array ([] when there are none): the
// --json of every listing command.
func printList[T any](cmd *cobra.Command, rows []T) error {
	if rows == nil {
		rows = []T{}
	}
	return json.NewEncoder(cmd.OutOrStdout()).Encode(rows)
}
