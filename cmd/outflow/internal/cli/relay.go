package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/walrelay"
)

func newRelayCmd(e *env) *cobra.Command {
	var (
		metricsAddr      string
		streamPartitions int
		cfg              walrelay.Config
	)
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Run the WAL mode's relay: publish the outbox's WAL messages through a replication slot",
		Long: `Run the relay of the WAL mode (writers with outbox.Config{Mode: outbox.ModeWAL}): it reads
their logical decoding messages through a replication slot, in commit order, and publishes
the events to the broker, confirming the slot only past what the broker acknowledged.
Start two or more: one reads, the others stand by and take over within a second.
The database needs wal_level=logical; see docs/wal-mode.md.`,
		Args: cobra.NoArgs,
	}
	fs := cmd.Flags()
	fs.StringVar(&cfg.SlotName, "slot", walrelay.DefaultSlotName, "the logical replication slot")
	fs.StringVar(&cfg.Publication, "publication", walrelay.DefaultPublication, "the empty publication pgoutput is given")
	fs.StringVar(&cfg.Prefix, "prefix", "outflow", "the writers' WALPrefix")
	fs.BoolVar(&cfg.FailoverSlot, "failover-slot", false, "create the slot with failover = true (PostgreSQL 17: kept by standbys with sync_replication_slots)")
	fs.IntVar(&cfg.MaxChanges, "max-changes", walrelay.DefaultMaxChanges, "changes per read of the slot (whole transactions)")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", walrelay.DefaultHeartbeatInterval, "an idle relay's heartbeat, which lets the slot release WAL")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", 10, "attempts before a refused event is parked for an operator")
	fs.DurationVar(&cfg.RetryBackoff, "retry-backoff", time.Second, "first retry delay of a refused event (doubles, with jitter)")
	fs.DurationVar(&cfg.RetryBackoffMax, "retry-backoff-max", 5*time.Minute, "largest retry delay of a refused event")
	fs.DurationVar(&cfg.HistoryRetention, "history-retention", walrelay.DefaultHistoryRetention, "how long outbox_wal_history keeps a day (negative: no history)")
	fs.IntVar(&streamPartitions, "stream-partitions", 1, "Redis streams per topic, by hash of the aggregate id")
	addMetricsAddrFlag(fs, &metricsAddr, DefaultMetricsAddr, "address serving /metrics, /healthz and /readyz")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if streamPartitions < 1 || streamPartitions > 1024 {
			return errors.New("invalid --stream-partitions: must be between 1 and 1024")
		}
		c, logger, err := e.load()
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		pool, err := openPool(ctx, c.DatabaseURL)
		if err != nil {
			return err
		}
		defer pool.Close()
		app, err := appInstalled(ctx, pool)
		if err != nil {
			return err
		}
		backend, err := brokers.Open(ctx, brokerConfig(c, streamPartitions, logger, app))
		if err != nil {
			return err
		}
		defer backend.Close()
		reg := newRegistry()
		rc := cfg
		rc.Pool, rc.Broker, rc.Registerer, rc.Logger = pool, backend.Broker(), reg, logger
		// The broker audit as the forwarder's (AUDIT_INTERVAL), from the
		// history: on when the broker is an Auditor.
		rc.AuditInterval = c.AuditInterval
		r, err := walrelay.New(rc)
		if err != nil {
			return err
		}
		ready := e.newReadiness()
		ready.addDatabase(pool)
		ready.addBroker(backend)
		ready.add("relay", func(context.Context) error { return r.Ready() })
		if metricsAddr = resolveMetricsAddr(cmd, metricsAddr); metricsAddr != "" {
			stop, err := serveMetrics(ctx, metricsAddr, reg, ready, logger)
			if err != nil {
				return err
			}
			defer stop()
		}
		ready.markStarted()
		return r.Run(ctx)
	}
	cmd.AddCommand(newRecoverSlotCmd(e), newRelayParkedCmd(e, false), newRelayParkedCmd(e, true))
	return cmd
}

func newRecoverSlotCmd(e *env) *cobra.Command {
	var rc walrelay.RecoverConfig
	cmd := &cobra.Command{
		Use:   "recover-slot",
		Short: "After a lost replication slot: record the lost WAL range and create a new slot",
		Long: `Run when the relay reports its slot lost (ErrSlotLost, slot_wal_status lost or missing).
It takes the reader's lock (no relay reads meanwhile), drops the invalidated slot, creates a
new one, records in outbox_wal_slots the WAL range whose events were never relayed, and prints
it. The relays resume on their own. It refuses a slot that is not lost. The events of the
range must be salvaged from a WAL archive or the business tables: see docs/wal-mode.md.`,
		Args: cobra.NoArgs,
	}
	cmd.Flags().StringVar(&rc.SlotName, "slot", walrelay.DefaultSlotName, "the relay's replication slot")
	cmd.Flags().StringVar(&rc.Publication, "publication", walrelay.DefaultPublication, "the relay's publication")
	cmd.Flags().BoolVar(&rc.FailoverSlot, "failover-slot", false, "create the new slot with failover = true (PostgreSQL 17)")
	cmd.RunE = e.withPool(nil, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
		_, logger, err := e.load()
		if err != nil {
			return err
		}
		rc.Logger = logger
		lr, err := walrelay.RecoverSlot(cmd.Context(), pool, rc)
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "slot %s was %s; new slot created.\nlost range (recorded in outbox_wal_slots): from %s to %s\n",
			lr.Slot, lr.Status, lr.From, lr.To)
		return nil
	})
	return cmd
}

func newRelayParkedCmd(e *env, discard bool) *cobra.Command {
	var f walrelay.ParkedFilter
	use, short := "retry-parked", "Make the WAL mode's parked events due again"
	if discard {
		use, short = "discard-parked", "Give up on the WAL mode's parked events: publish their discard markers"
	}
	cmd := &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs}
	cmd.Flags().Int64Var(&f.ID, "id", 0, "one parked event, by its id in outbox_wal_parked (0: all)")
	cmd.Flags().StringVar(&f.Topic, "topic", "", "only this topic's")
	cmd.RunE = e.withPool(func() error {
		if f.ID < 0 {
			return errors.New("invalid --id: must not be negative")
		}
		return nil
	}, func(cmd *cobra.Command, pool *pgxpool.Pool) error {
		var n int64
		var err error
		if discard {
			n, err = walrelay.DiscardParked(cmd.Context(), pool, f)
		} else {
			n, err = walrelay.RetryParked(cmd.Context(), pool, f)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%d parked events released\n", n)
		return nil
	})
	return cmd
}
