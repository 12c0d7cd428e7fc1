package sql

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/once"
	"github.com/outflow-dev/outflow/internal/redact"
)

func init() { brokers.Register(brokers.SQL, open) }

// sqlTopicChars is watermill-sql's rule for topics (they are spliced into
// table names).
var sqlTopicChars = regexp.MustCompile(`^[A-Za-z0-9\-\$\:\.\_]*$`)

// maxSQLTopic keeps "watermill_offsets_" + topic within PostgreSQL's 63-byte
// identifiers: a longer name would be cut and two topics could share a table.
const maxSQLTopic = 63 - len("watermill_offsets_")

// A topic is one table, watermill_<prefix><topic>, read in (transaction id,
// offset) order; StreamPartitions does not apply (one group of one table is
// serialized by a row lock whatever the partitioning). Offsets per group
// are in watermill_offsets_<prefix><topic>.
type sqlBackend struct {
	cfg    brokers.Config
	pool   *pgxpool.Pool
	db     wmsql.Beginner
	schema wmsql.DefaultPostgreSQLSchema
	offs   wmsql.DefaultPostgreSQLOffsetsAdapter
	init   *wmsql.Subscriber // never subscribes: runs the DDL
	logger watermill.LoggerAdapter

	channel string // NOTIFY channel of the tables' schema

	mu     sync.Mutex
	tables once.ByKey
	subs   int // subscriptions holding (or waiting for) a connection
	wakes  sqlWakes
}

// open opens the sql backend of cfg (its SQL block), whose defaults
// [brokers.Open] has set.
func open(ctx context.Context, cfg brokers.Config) (brokers.Backend, error) {
	s := &cfg.SQL
	if s.DatabaseURL == "" {
		return nil, errors.New("sql broker: DatabaseURL (--broker-database-url or --database-url) is required")
	}
	if s.Retention == 0 {
		s.Retention = 7 * 24 * time.Hour
	}
	if s.PollInterval == 0 {
		s.PollInterval = 100 * time.Millisecond
	}
	if s.PollInterval < 0 || s.AckDeadline < 0 || s.SubscribeBatchSize < 0 || s.MaxConns < 0 {
		return nil, errors.New("sql broker: PollInterval, AckDeadline, SubscribeBatchSize and MaxConns must not be negative")
	}
	if err := checkSQLTopic(s.TablePrefix); err != nil {
		return nil, fmt.Errorf("TablePrefix: %w", err)
	}
	if cfg.StreamPartitions > 1 {
		cfg.Logger.Warn("sql broker: StreamPartitions ignored: a topic is one table, and one consumer group reads it serially", "partitions", cfg.StreamPartitions)
	}
	where := redact.URL(s.DatabaseURL)
	pcfg, err := pgxpool.ParseConfig(s.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("sql broker: database URL %s: %w", where, err)
	}
	if s.MaxConns > 0 {
		pcfg.MaxConns = s.MaxConns
	} else if !strings.Contains(s.DatabaseURL, "pool_max_conns") {
		pcfg.MaxConns = 20
	}
	s.MaxConns = pcfg.MaxConns
	if pcfg.ConnConfig.ConnectTimeout == 0 || pcfg.ConnConfig.ConnectTimeout > 5*time.Second {
		pcfg.ConnConfig.ConnectTimeout = 3 * time.Second
	}
	fail := func(err error) error {
		return fmt.Errorf("connect to PostgreSQL (sql broker) at %s: %w (is it running? try `make services-up`)", where, err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fail(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fail(err)
	}
	var schema string
	if err := pool.QueryRow(pctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		pool.Close()
		return nil, fail(err)
	}
	b := &sqlBackend{cfg: cfg, pool: pool, db: wmsql.BeginnerFromPgx(pool),
		logger: watermill.NewSlogLogger(cfg.Logger), channel: sqlChannel(schema)}
	// BYTEA, not JSON: a payload the json type would refuse must not fail
	// its whole batch's INSERT. The DDL runs in a transaction under
	// watermill's advisory lock, so instances creating one table at once do
	// not race.
	b.schema = wmsql.DefaultPostgreSQLSchema{
		GeneratePayloadType: func(string) string { return "BYTEA" },
		SubscribeBatchSize:  s.SubscribeBatchSize,
	}
	b.init, err = wmsql.NewSubscriber(b.db, wmsql.SubscriberConfig{SchemaAdapter: b.schema, OffsetsAdapter: b.offs}, b.logger)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return b, nil
}

// errSQLTopic marks a topic that cannot name a table: the row's fault, not
// the database's.
var errSQLTopic = errors.New("sql broker: topic cannot name a table")

func checkSQLTopic(topic string) error {
	if !sqlTopicChars.MatchString(topic) {
		return fmt.Errorf("%w: %q: only letters, digits and - $ : . _", errSQLTopic, topic)
	}
	if len(topic) > maxSQLTopic {
		return fmt.Errorf("%w: %q is over %d characters (PostgreSQL cuts identifiers at 63 bytes)", errSQLTopic, topic, maxSQLTopic)
	}
	return nil
}

func (b *sqlBackend) Kind() brokers.Kind { return brokers.SQL }

// Topics is the one prefixed topic: a table has no partitions.
func (b *sqlBackend) Topics(topic string) []string {
	return []string{b.cfg.SQL.TablePrefix + topic}
}

// ensureTables creates the message and offsets tables of topic (already
// prefixed) once per process.
func (b *sqlBackend) ensureTables(topic string) error {
	return b.tables.Do(topic, func() error {
		if err := checkSQLTopic(topic); err != nil {
			return err
		}
		if err := b.init.SubscribeInitialize(topic); err != nil {
			return fmt.Errorf("sql broker: create tables of %q: %w", topic, err)
		}
		return nil
	})
}

func (b *sqlBackend) Broker() forwarder.Broker { return sqlBroker{b} }

type sqlBroker struct{ b *sqlBackend }

// maxRowsPerInsert keeps one INSERT under PostgreSQL's 65535 parameters
// (three per message).
const maxRowsPerInsert = 5000

// Publish appends the batch in one transaction: one multi-row INSERT per
// topic, rows in the order given. A failure of the database or the
// connection wraps ErrBrokerUnavailable; a row the database refuses (a data
// exception: the INSERT cannot say which row) makes the batch's rows be
// tried one by one, each in its own transaction, so only that row fails.
func (sb sqlBroker) Publish(ctx context.Context, msgs []forwarder.Outgoing) []error {
	b := sb.b
	errs := make([]error, len(msgs))
	var topics []string
	byTopic := map[string][]int{}
	for i, m := range msgs {
		topic := b.cfg.SQL.TablePrefix + m.Topic
		if err := b.ensureTables(topic); err != nil {
			errs[i] = sqlError(err)
			continue
		}
		if _, ok := byTopic[topic]; !ok {
			topics = append(topics, topic)
		}
		byTopic[topic] = append(byTopic[topic], i)
	}
	if len(topics) == 0 {
		return errs
	}
	err := b.insert(ctx, msgs, topics, byTopic)
	if err == nil {
		b.notify(ctx, topics)
		return errs
	}
	if err = sqlError(err); errors.Is(err, forwarder.ErrBrokerUnavailable) {
		for _, t := range topics {
			for _, i := range byTopic[t] {
				errs[i] = err
			}
		}
		return errs
	}
	var inserted []string
	for _, t := range topics {
		ok := false
		for _, i := range byTopic[t] {
			if err := b.insert(ctx, msgs, []string{t}, map[string][]int{t: {i}}); err != nil {
				errs[i] = sqlError(err)
			} else {
				ok = true
			}
		}
		if ok {
			inserted = append(inserted, t)
		}
	}
	if len(inserted) > 0 {
		b.notify(ctx, inserted)
	}
	return errs
}

// insert appends the rows in one implicit transaction: every INSERT in one
// pgx batch, which PostgreSQL runs as one transaction up to its Sync, in a
// single round trip (the BEGIN and COMMIT of an explicit one were two
// more on every event's way, while the forwarder's claim waits).
func (b *sqlBackend) insert(ctx context.Context, msgs []forwarder.Outgoing, topics []string, byTopic map[string][]int) error {
	var q pgx.Batch
	for _, t := range topics {
		idx := byTopic[t]
		for len(idx) > 0 {
			n := min(len(idx), maxRowsPerInsert)
			batch := make(message.Messages, n)
			for j, i := range idx[:n] {
				batch[j] = msgs[i].Message
			}
			ins, err := b.schema.InsertQuery(wmsql.InsertQueryParams{Topic: t, Msgs: batch})
			if err != nil {
				return fmt.Errorf("insert query of %q: %w", t, err)
			}
			q.Queue(ins.Query, ins.Args...)
			idx = idx[n:]
		}
	}
	return b.pool.SendBatch(ctx, &q).Close()
}

// sqlError wraps err in ErrBrokerUnavailable unless PostgreSQL refused the
// data itself (SQLSTATE classes 22, data exception, and 54, program limit
// exceeded) or the topic cannot name a table.
func sqlError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "54")) {
		return fmt.Errorf("sql broker: insert refused: %w", err)
	}
	if errors.Is(err, errSQLTopic) || errors.Is(err, wmsql.ErrInvalidTopicName) {
		return err
	}
	return fmt.Errorf("%w: sql broker: %w", forwarder.ErrBrokerUnavailable, err)
}

// reserve counts a subscription of topic against the pool, or refuses it
// when it would leave no connection free (rather than hang).
func (b *sqlBackend) reserve(topic string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if int32(b.subs+1) >= b.cfg.SQL.MaxConns {
		return fmt.Errorf("sql broker: subscription %d to %q needs a pool over %d connections (each holds one while it handles a batch): raise MaxConns or pool_max_conns",
			b.subs+1, topic, b.cfg.SQL.MaxConns)
	}
	b.subs++
	return nil
}

// sqlQueries are a topic's statements for the subscriber, over
// watermill-sql's tables: a group has read every row at or below its
// (last_processed_transaction_id, offset_acked), and a row is readable once
// its transaction id is below the snapshot's xmin (every older transaction
// has ended, so no row can ever appear before it).
type sqlQueries struct {
	init, probe, lock, read, ack string
}

func (b *sqlBackend) queries(topic string) sqlQueries {
	msgs, offs := b.schema.MessagesTable(topic), b.offs.MessagesOffsetsTable(topic)
	return sqlQueries{
		init: `INSERT INTO ` + offs + ` (consumer_group, offset_acked, last_processed_transaction_id)
			VALUES ($1, 0, '0') ON CONFLICT DO NOTHING`,
		probe: `SELECT m.transaction_id < pg_snapshot_xmin(pg_current_snapshot())
			FROM ` + offs + ` g CROSS JOIN LATERAL (
				SELECT transaction_id FROM ` + msgs + ` m
				WHERE (m.transaction_id, m."offset") > (g.last_processed_transaction_id, coalesce(g.offset_acked, 0))
				ORDER BY m.transaction_id, m."offset" LIMIT 1) m
			WHERE g.consumer_group = $1`,
		// The position's commit need not wait for the WAL flush: a crash
		// of the server can lose it only with the acks before it, and
		// what was acked is then read again and dropped by the
		// middleware. It saves a disk flush per read.
		lock: `SELECT last_processed_transaction_id::text, coalesce(offset_acked, 0),
				set_config('synchronous_commit', 'off', true)
			FROM ` + offs + ` WHERE consumer_group = $1 FOR UPDATE`,
		read: `SELECT "offset", transaction_id::text, uuid, payload, metadata,
				transaction_id < pg_snapshot_xmin(pg_current_snapshot())
			FROM ` + msgs + `
			WHERE (transaction_id, "offset") > ($1::xid8, $2::bigint)
			ORDER BY transaction_id, "offset" LIMIT $3`,
		ack: `UPDATE ` + offs + ` SET offset_acked = $1, last_processed_transaction_id = $2::xid8
			WHERE consumer_group = $3`,
	}
}

func (b *sqlBackend) release(n int) {
	b.mu.Lock()
	b.subs -= n
	b.mu.Unlock()
}

func (b *sqlBackend) Close() error {
	b.wakes.close()
	b.pool.Close()
	return nil
}
