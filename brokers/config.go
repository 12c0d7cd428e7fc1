package brokers

import "time"

// The per-backend blocks of [Config] are plain data, so that configuring a
// backend links none of its client: only the backend's package (imported
// for its registration) does.

// RedisConfig is the Redis Streams block.
type RedisConfig struct {
	// URL is a go-redis URL: one server, a Cluster or Sentinel (see
	// redis.NewClient in brokers/redis). Defaults to redis://127.0.0.1:6379/0.
	URL string
	// StreamPrefix is prepended to every stream name. Defaults to "".
	StreamPrefix string
	// Cluster says URL names a Redis Cluster node even when it names only
	// one (a URL with addr= parameters is a Cluster already). A single
	// server that runs in cluster mode is refused without it.
	Cluster bool
	// WaitReplicas, when above 0, makes the forwarder send WAIT after each
	// batch and count a batch that fewer replicas acknowledged within
	// WaitTimeout as not published (retried, never marked). Defaults to 0:
	// no WAIT.
	WaitReplicas int
	// WaitTimeout bounds each WAIT. Defaults to 1s when WaitReplicas is set.
	WaitTimeout time.Duration
}

// NATSConfig is the NATS JetStream block.
type NATSConfig struct {
	// URL defaults to nats://127.0.0.1:4222.
	URL string
	// StreamPrefix is prepended to every stream and subject name. Defaults
	// to "".
	StreamPrefix string
	// Replicas of each stream. Defaults to 1.
	Replicas int
	// PublishTimeout bounds the wait for a batch's acknowledgements.
	// Defaults to 5s.
	PublishTimeout time.Duration
}

// AMQPConfig is the RabbitMQ (AMQP 0-9-1) block.
type AMQPConfig struct {
	// URL defaults to amqp://guest:guest@127.0.0.1:5672/.
	URL string
	// Prefix is prepended to every exchange and queue name. Defaults to "".
	Prefix string
	// Groups lists, per topic, the consumer groups whose queues the
	// forwarder declares and binds before its first publish to the topic:
	// RabbitMQ drops what reaches an exchange with no queue bound, so an
	// event published before a group's first worker ever subscribed would
	// be lost to that group (the publish fails with the amqp package's
	// ErrUnroutable and the row is retried, then parked). List every
	// handler (consumer group) of every topic: a consumer.Worker's Groups
	// method gives those of its handlers. Nil or empty declares none (a
	// worker declares its own queue when it subscribes).
	Groups map[string][]string
	// NackDelay is how long a nacked message is held before RabbitMQ
	// requeues it (RabbitMQ redelivers a requeued message at once).
	// Defaults to 1s.
	NackDelay time.Duration
	// ConnectTimeout bounds one dial and handshake. Defaults to 3s.
	ConnectTimeout time.Duration
	// CompetingConsumers makes the instances of a group share each queue's
	// messages. By default (false) every queue is declared with
	// x-single-active-consumer: one instance of a group consumes a
	// partition's queue at a time, in publish order, and the others stand
	// by and take over when it goes; the partitions spread a group's load
	// over its instances. A queue's arguments are fixed when it is first
	// declared (RabbitMQ refuses a redeclaration with others), so changing
	// this for a running system needs a new Prefix.
	CompetingConsumers bool
	// MaxMessageBytes is the server's max_message_size, which RabbitMQ does
	// not tell its clients: the forwarder and the outbox writer refuse a
	// larger message body. Defaults to RabbitMQ's default for the version
	// the server reports: 16 MiB from 4.0, 128 MiB from 3.8 to 3.13.
	MaxMessageBytes int
}

// KafkaConfig is the Kafka block.
type KafkaConfig struct {
	// Brokers are the bootstrap brokers, host:port. Defaults to
	// 127.0.0.1:9092.
	Brokers []string
	// TopicPrefix is prepended to every Kafka topic name and consumer
	// group id, so deployments can share a cluster. It may hold only
	// letters, digits, '.', '_' and '-'. Defaults to "".
	TopicPrefix string
	// TopicPartitions is the partition count of each topic the backend
	// creates (topics that already exist keep theirs). A group has at most
	// this many messages in flight per handler, one per partition.
	// [Config.StreamPartitions] is not used by Kafka. Defaults to 8.
	TopicPartitions int32
	// ReplicationFactor of each topic the backend creates. Defaults to -1,
	// the broker's default.replication.factor (needs Version 2.4 or later).
	ReplicationFactor int16
	// Version is the Kafka protocol version sarama speaks, such as "2.8.0"
	// or "3.6.0". Defaults to 2.8.0.
	Version string
	// DialTimeout bounds connecting to one broker; Open gives up on an
	// unreachable cluster after about this long. Defaults to 3s.
	DialTimeout time.Duration
	// PublishTimeout is how long the partition leader waits for all
	// in-sync replicas to acknowledge a batch. Defaults to 10s.
	PublishTimeout time.Duration
	// SessionTimeout is how long a consumer may go without a heartbeat
	// before its group gives its partitions to another; it must lie within
	// the broker's group.min.session.timeout.ms (6s by default) and
	// group.max.session.timeout.ms. A consumer that stops cleanly leaves at
	// once. Defaults to 10s.
	SessionTimeout time.Duration
	// TopicCheckInterval is how often a running subscription reads its
	// topic's id (one metadata request): a topic deleted and recreated
	// under it makes it rejoin its group, which reads the new topic from
	// its start, instead of resuming at the old topic's offsets and
	// skipping the new one's first records (docs/broker-loss.md). Records
	// of the new topic read before the check saw it may be delivered
	// again. Defaults to 5s.
	TopicCheckInterval time.Duration
}

// SQLConfig is the sql block: PostgreSQL only, no broker. The forwarder
// appends outbox rows to watermill-sql message tables and the workers read
// them with Outflow's own subscriber over those tables (same schema, same
// offsets), one consumer group per handler.
type SQLConfig struct {
	// DatabaseURL is the PostgreSQL holding the message tables
	// (--broker-database-url, defaulting to --database-url). Tables are
	// created in the first schema of the URL's search_path. Required.
	DatabaseURL string
	// TablePrefix is prepended to every topic: topic t is the tables
	// watermill_<prefix><t> (messages) and watermill_offsets_<prefix><t>
	// (one row per consumer group). Letters, digits and - $ : . _ only, and
	// prefix plus topic at most 45 characters (PostgreSQL cuts identifiers
	// at 63 bytes). Defaults to "".
	TablePrefix string
	// PollInterval is how long a subscription waits after a look found
	// nothing, unless a notification wakes it first: the forwarder's side
	// sends one NOTIFY per topic after each batch's commit, so this is the
	// fallback (a lost LISTEN connection). A look is one read-only query:
	// it takes no lock and spends no transaction id. Defaults to 100ms.
	PollInterval time.Duration
	// AckDeadline is how long a read waits for its messages to be taken
	// and acked before it ends, committing the position after the acked
	// prefix; the rest is read again (the handlers are not interrupted).
	// While a read is open, its transaction holds back the rows of every
	// topic of the PostgreSQL server, so this also bounds how long a stuck
	// handler can stall them. Defaults to the worker's ClaimIdle
	// (--claim-idle, 30 s).
	AckDeadline time.Duration
	// SubscribeBatchSize is how many rows one read takes. They are handed
	// to the router at once (one aggregate's rows one at a time, lowest
	// version first, each after the previous ack), so the middleware shares
	// its transactions among them; the read's transaction holds the
	// group's lock until every one is acked. Defaults to the worker's batch
	// size (--consumer-batch-size, 100).
	SubscribeBatchSize int
	// MaxConns is the size of the broker's connection pool. Every
	// subscription holds one connection (and a transaction) while it
	// handles a batch or waits on its group's lock; the forwarder takes one
	// per Publish. Subscribe fails when a subscription would leave no
	// connection free (rather than hang). A process with subscriptions
	// holds one more connection, outside the pool, in LISTEN. Defaults to
	// pool_max_conns in DatabaseURL, else 20.
	MaxConns int32
	// Retention is how long a message stays in its topic's table after
	// every consumer group of the topic has acked it: watermill-sql never
	// deletes a row, so the tables would grow forever. A topic no group has
	// ever acked on is kept whole. [Trimmer] does the deleting; the
	// forwarder runs it. Defaults to 7 days; negative keeps everything.
	Retention time.Duration
}
