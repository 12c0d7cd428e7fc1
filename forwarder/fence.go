package forwarder

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The fence keeps a partition's lease from changing hands while a batch of
// its rows is out: the instance publishing it may be slow (a broker that
// stalls, a lease loop that stopped renewing) and another instance taking
// the partition then would publish an aggregate's later rows before the
// batch's earlier ones.
//
// It is a transaction-scoped advisory lock per partition, not a row lock
// on the lease rows: a claim holds it shared, and whatever changes a
// partition's owner (a takeover, a release, a retirement, a repartition)
// takes it exclusively first. Locking the lease rows FOR SHARE did the
// same, but a row lock is written into the row and logged: each claim
// wrote a WAL record per partition held, about 870 B per event when claims
// carry one event each, a service's everyday rate (docs/benchmarks.md).
// An advisory lock lives in shared memory only.
//
// Every holder locks partitions in ascending order, so that two of them
// cannot wait for each other; a takeover only tries (it skips a partition
// whose batch is out, as SKIP LOCKED did).

// fenceKey is the fence's lock key for the partition in column col: the
// schema's hash (each schema has its own outbox) in the high half, the
// partition in the low one. The other advisory locks of the package use
// the two-key form, whose keys never meet the one-key form's.
func fenceKey(col string) string {
	return `((hashtext(current_schema())::bigint << 32) | ` + col + `::bigint)`
}

// fenceClaimSQL holds the fence, shared, on the partitions instance $1
// leases, and returns them: the claim that follows, with its own snapshot,
// serves these only, as its owner can no longer change.
var fenceClaimSQL = `
SELECT partition FROM (
    SELECT partition, pg_advisory_xact_lock_shared(` + fenceKey("partition") + `) FROM (
        SELECT partition FROM outbox_partitions WHERE owner = $1 AND lease_until > now()
        ORDER BY partition OFFSET 0) o
) l`

// fenceWait takes, in tx, the fence on the partitions of
// outbox_partitions where cond (with args) holds, exclusively: it waits
// for their batches out, and keeps new ones off them until tx ends. Run it
// before changing their owner or removing them.
func fenceWait(ctx context.Context, tx pgx.Tx, cond string, args ...any) error {
	_, err := tx.Exec(ctx, `
SELECT count(*) FROM (
    SELECT pg_advisory_xact_lock(`+fenceKey("partition")+`) FROM (
        SELECT partition FROM outbox_partitions WHERE `+cond+`
        ORDER BY partition OFFSET 0) s
) l`, args...)
	if err != nil {
		return fmt.Errorf("wait for the partitions' batches: %w", err)
	}
	return nil
}
