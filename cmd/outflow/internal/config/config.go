// Package config reads Outflow's process configuration from the environment
// and command-line flags, and reports a bad value naming the variable or
// flag it came from, never echoing a secret.
package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/pflag"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/cloudevents"
	"github.com/outflow-dev/outflow/internal/redact"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
)

// Defaults.
const (
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/outflow?sslmode=disable"
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
	DefaultHTTPAddr    = "127.0.0.1:8080"
	DefaultLogLevel    = "info"
	DefaultLogFormat   = "text"
	DefaultBroker      = "redis"
	DefaultNATSURL     = "nats://127.0.0.1:4222"
	DefaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultKafkaBroker = "127.0.0.1:9092"
	DefaultAMQPGroups  = ""
	// DefaultConsoleAddr is where the operator console listens.
	DefaultConsoleAddr = "127.0.0.1:8090"
	// DefaultWebhookSecretGrace is how long a rotated-out webhook secret
	// stays valid.
	DefaultWebhookSecretGrace = "24h"
)

// Backend tuning defaults, as the brokers package sets them.
const (
	DefaultNATSReplicas         = "1"
	DefaultKafkaTopicPartitions = "8"
	DefaultSQLPollInterval      = "100ms"
	DefaultRedisWaitReplicas    = "0"
	DefaultRedisWaitTimeout     = "1s"
)

// Broker-loss audit defaults, as the forwarder sets them.
const (
	DefaultAuditInterval = "20s"
)

// Config is what every subcommand shares.
type Config struct {
	DatabaseURL string
	RedisURL    string
	// RedisCluster says RedisURL names a Redis Cluster node.
	RedisCluster bool
	// RedisWaitReplicas and RedisWaitTimeout: see
	// [brokers.RedisConfig.WaitReplicas].
	RedisWaitReplicas int
	RedisWaitTimeout  time.Duration
	HTTPAddr          string
	LogLevel          slog.Level
	// LogFormat is "text" or "json" (one JSON object a line, for a log
	// collector that parses fields).
	LogFormat string
	// Broker is the backend the forwarder publishes to and the workers
	// read from.
	Broker       brokers.Kind
	NATSURL      string
	AMQPURL      string
	KafkaBrokers []string
	// AMQPGroups lists, per topic, the consumer groups whose queues the
	// forwarder declares before publishing (see [brokers.AMQPConfig]).
	AMQPGroups map[string][]string
	// NATSReplicas is the replica count of each stream the backend
	// creates.
	NATSReplicas int
	// KafkaTopicPartitions is the partition count of each topic the
	// backend creates.
	KafkaTopicPartitions int32
	// CloudEvents says whether and how every broker but sql carries the
	// CloudEvents attributes of each message (brokers.Config.CloudEvents).
	CloudEvents cloudevents.Config
	// AMQPMaxMessageBytes is the RabbitMQ server's max_message_size; 0:
	// RabbitMQ's default for the server's version.
	AMQPMaxMessageBytes int
	// SQLPollInterval is how long a sql-broker subscription waits after a
	// poll found nothing.
	SQLPollInterval time.Duration
	// BrokerDatabaseURL is the PostgreSQL of the sql broker; empty means
	// DatabaseURL.
	BrokerDatabaseURL string
	// WebhookAllowPrivate allows plain http webhook URLs and private,
	// loopback and link-local webhook destinations, at creation and when
	// sending: for local development and tests only.
	WebhookAllowPrivate bool
	// WebhookSecretGrace is how long a rotated-out webhook secret stays
	// valid (the sender signs with both meanwhile).
	WebhookSecretGrace time.Duration
	// AuditInterval is how often the forwarder, or the WAL relay, audits
	// the broker for lost entries (forwarder.Config.AuditInterval,
	// walrelay.Config.AuditInterval); negative disables.
	AuditInterval time.Duration
	// SecretKey seals webhook secrets at rest (OUTFLOW_SECRET_KEY, never a
	// flag: a flag shows in the process list). Nil when not set: secrets
	// are stored in plaintext, and the process warns at start.
	SecretKey *secretseal.Key
	// ConsoleAddr is the operator console's address (`outflow console`,
	// the console role of `outflow serve`).
	ConsoleAddr string
	// ConsoleInsecureCookie drops the Secure attribute of the console's
	// session cookie, for plain HTTP on a loopback address only: Load
	// refuses it with any other ConsoleAddr.
	ConsoleInsecureCookie bool
	// ConsoleOperatorKeySHA256 is the SHA-256 of the key that logs in to
	// the console on a database without the reference app's tables (whose
	// admin API keys log in where they are installed); nil when not set.
	ConsoleOperatorKeySHA256 []byte
}

// setting ties a flag to its environment variable and default.
type setting struct {
	flag, env, def, usage string
}

var settings = []setting{
	{"database-url", "DATABASE_URL", DefaultDatabaseURL, "PostgreSQL connection URL"},
	{"redis-url", "REDIS_URL", DefaultRedisURL, "Redis connection URL (a Cluster: redis://node1:port?addr=node2:port&addr=node3:port)"},
	{"redis-cluster", "REDIS_CLUSTER", "false", "true when --redis-url names one node of a Redis Cluster (a URL with addr= is a Cluster already)"},
	{"redis-wait-replicas", "REDIS_WAIT_REPLICAS", DefaultRedisWaitReplicas, "replicas that must acknowledge each batch (Redis WAIT, on every primary written to) before its rows are marked published; 0: no WAIT; for --broker redis"},
	{"redis-wait-timeout", "REDIS_WAIT_TIMEOUT", DefaultRedisWaitTimeout, "how long each WAIT may take (1ms to 1m; keep it under the Redis client's read timeout, 3s by default); rows of a batch too few replicas acknowledged in time are retried; for --broker redis"},
	{"http-addr", "HTTP_ADDR", DefaultHTTPAddr, "address the HTTP API listens on"},
	{"log-level", "LOG_LEVEL", DefaultLogLevel, "debug, info, warn or error"},
	{"log-format", "LOG_FORMAT", DefaultLogFormat, "text or json (one object a line)"},
	{"broker", "OUTFLOW_BROKER", DefaultBroker, "broker backend: redis, nats, amqp, kafka or sql"},
	{"nats-url", "NATS_URL", DefaultNATSURL, "NATS (JetStream) URL, for --broker nats"},
	{"amqp-url", "AMQP_URL", DefaultAMQPURL, "RabbitMQ URL, for --broker amqp"},
	{"amqp-groups", "AMQP_GROUPS", DefaultAMQPGroups, "consumer groups, besides the outflow worker's own handlers, whose RabbitMQ queues the forwarder declares before its first publish, topic=group,group[;topic=group...]: list the handlers of other processes, or RabbitMQ drops what is published before their first worker subscribes; for --broker amqp"},
	{"amqp-max-message-bytes", "AMQP_MAX_MESSAGE_BYTES", "0", "the RabbitMQ server's max_message_size, which it does not tell clients: the outbox writer and the forwarder refuse a larger event; 0: RabbitMQ's default for the server's version (16 MiB from 4.0, 128 MiB for 3.8 to 3.13); for --broker amqp"},
	{"cloudevents", "OUTFLOW_CLOUDEVENTS", "true", "write the CloudEvents 1.0 attributes of each event in the broker's binding (headers, or ce_ fields on Redis; not with --broker sql); false: Outflow's own metadata only (docs/events.md)"},
	{"cloudevents-source", "OUTFLOW_CLOUDEVENTS_SOURCE", cloudevents.DefaultSource, "the CloudEvents source attribute of every event, a URI-reference: name the producing service (https://payments.example.com, /payments)"},
	{"cloudevents-dataschema", "OUTFLOW_CLOUDEVENTS_DATASCHEMA", "", "template of the CloudEvents dataschema attribute, an absolute URI with {type} and {version}, e.g. https://schemas.example.com/{type}/v{version}.json; empty: none"},
	{"kafka-brokers", "KAFKA_BROKERS", DefaultKafkaBroker, "comma-separated Kafka bootstrap brokers (host:port), for --broker kafka"},
	{"nats-replicas", "NATS_REPLICAS", DefaultNATSReplicas, "replicas of each JetStream stream Outflow creates (1-5), for --broker nats"},
	{"kafka-topic-partitions", "KAFKA_TOPIC_PARTITIONS", DefaultKafkaTopicPartitions, "partitions of each Kafka topic Outflow creates (existing topics keep theirs), for --broker kafka"},
	{"sql-poll-interval", "SQL_POLL_INTERVAL", DefaultSQLPollInterval, "how long a subscription of the sql broker waits after an empty look unless a NOTIFY from the forwarder wakes it first (a look is a read: no lock, no transaction id), for --broker sql"},
	{"broker-database-url", "BROKER_DATABASE_URL", "", "PostgreSQL URL of the sql broker's tables, for --broker sql (default: --database-url)"},
	{"audit-interval", "AUDIT_INTERVAL", DefaultAuditInterval, "how often the forwarder holding partition 0 checks the broker for entries it lost after acknowledging them (a flush, a restart without persistence, a failover to a replica behind) and publishes them again; negative disables (docs/broker-loss.md)"},
	{"console-addr", "CONSOLE_ADDR", DefaultConsoleAddr, "address the operator console listens on (outflow console; outflow serve --roles console)"},
	{"console-insecure-cookie", "CONSOLE_INSECURE_COOKIE", "false", "send the console's session cookie without Secure, so that a browser keeps it over plain http: only with a loopback --console-addr (behind a TLS proxy, leave it false)"},
	{"console-operator-key-sha256", "CONSOLE_OPERATOR_KEY_SHA256", "", "hex SHA-256 of the key that logs in to the console on a database without the reference app's tables (where they are installed, admin API keys log in). " +
		"Set it in the environment: a flag's value is visible to other users of the machine (ps). " +
		"Make the key of 32 random bytes, then hash it: KEY=$(openssl rand -base64 32); printf %s \"$KEY\" | sha256sum | cut -d' ' -f1"},
	{"webhook-secret-grace", "WEBHOOK_SECRET_GRACE", DefaultWebhookSecretGrace, "how long a merchant's previous webhook secret stays valid after a rotation (webhooks are signed with both meanwhile; 0s to 720h)"},
}

// allowPrivateFlag is the one boolean setting: --webhook-allow-private,
// WEBHOOK_ALLOW_PRIVATE.
const (
	allowPrivateFlag  = "webhook-allow-private"
	allowPrivateEnv   = "WEBHOOK_ALLOW_PRIVATE"
	allowPrivateUsage = "allow plain http webhook URLs and private, loopback and link-local webhook destinations: for local development only, never in production"
)

// Flags holds the raw values of the shared flags.
type Flags struct {
	fs           *pflag.FlagSet
	values       map[string]*string
	allowPrivate *bool
}

// Register adds the shared flags to fs. Their defaults are shown as the
// built-in ones; the environment is read in Load, so that an error can say
// which source a bad value came from.
func Register(fs *pflag.FlagSet) *Flags {
	f := &Flags{fs: fs, values: make(map[string]*string)}
	for _, s := range settings {
		f.values[s.flag] = fs.String(s.flag, s.def, fmt.Sprintf("%s (env %s)", s.usage, s.env))
	}
	f.allowPrivate = fs.Bool(allowPrivateFlag, false, fmt.Sprintf("%s (env %s)", allowPrivateUsage, allowPrivateEnv))
	return f
}

// connectionSettings are the settings whose values may hold a secret.
var connectionSettings = []string{"database-url", "redis-url", "nats-url", "amqp-url", "broker-database-url", "kafka-brokers"}

// ConnectionStrings returns every value given for a connection setting, by
// flag or environment, valid or not: what [redact.Text] and
// [redact.Handler] scrub out of what the process prints.
func (f *Flags) ConnectionStrings() []string {
	var out []string
	for _, s := range settings {
		for _, c := range connectionSettings {
			if s.flag != c {
				continue
			}
			if v := *f.values[s.flag]; v != "" {
				out = append(out, v)
			}
			if v := os.Getenv(s.env); v != "" {
				out = append(out, v)
			}
		}
	}
	return out
}

// Load resolves each setting (flag, then environment, then default) and
// validates it.
func (f *Flags) Load() (Config, error) {
	get := func(s setting) (value, source string) {
		if f.fs.Changed(s.flag) {
			return *f.values[s.flag], "--" + s.flag
		}
		if v, ok := os.LookupEnv(s.env); ok && v != "" {
			return v, s.env
		}
		return s.def, "default of --" + s.flag
	}
	var cfg Config
	for _, s := range settings {
		v, src := get(s)
		var err error
		switch s.flag {
		case "database-url":
			cfg.DatabaseURL, err = v, validateDatabaseURL(v)
		case "redis-url":
			cfg.RedisURL, err = v, validateRedisURL(v)
		case "redis-cluster":
			cfg.RedisCluster, err = strconv.ParseBool(v)
			if err != nil {
				err = fmt.Errorf("want true or false, not %q", v)
			}
		case "redis-wait-replicas":
			cfg.RedisWaitReplicas, err = parseInt(v, 0, 16)
		case "redis-wait-timeout":
			cfg.RedisWaitTimeout, err = time.ParseDuration(v)
			if err == nil && (cfg.RedisWaitTimeout < time.Millisecond || cfg.RedisWaitTimeout > time.Minute) {
				err = fmt.Errorf("want a duration from 1ms to 1m, such as 1s: %q", v)
			}
		case "http-addr":
			cfg.HTTPAddr, err = v, validateAddr(v)
		case "log-level":
			cfg.LogLevel, err = parseLevel(v)
		case "log-format":
			cfg.LogFormat, err = v, validateLogFormat(v)
		case "broker":
			cfg.Broker, err = brokers.ParseKind(v)
		case "nats-url":
			cfg.NATSURL, err = v, validateNATSURL(v)
		case "amqp-url":
			cfg.AMQPURL, err = v, validateAMQPURL(v)
		case "amqp-groups":
			cfg.AMQPGroups, err = parseGroups(v)
		case "amqp-max-message-bytes":
			cfg.AMQPMaxMessageBytes, err = parseInt(v, 0, 1<<29)
		case "cloudevents":
			var on bool
			on, err = strconv.ParseBool(v)
			if err != nil {
				err = fmt.Errorf("want true or false, not %q", v)
			}
			cfg.CloudEvents.Disabled = !on
		case "cloudevents-source":
			cfg.CloudEvents.Source = v
			err = cloudevents.Config{Source: v}.Validate()
		case "cloudevents-dataschema":
			cfg.CloudEvents.DataSchema = v
			err = cloudevents.Config{DataSchema: v}.Validate()
		case "nats-replicas":
			var n int
			n, err = parseInt(v, 1, 5)
			cfg.NATSReplicas = n
		case "kafka-topic-partitions":
			var n int
			n, err = parseInt(v, 1, 10000)
			cfg.KafkaTopicPartitions = int32(n)
		case "sql-poll-interval":
			cfg.SQLPollInterval, err = time.ParseDuration(v)
			if err == nil && (cfg.SQLPollInterval < time.Millisecond || cfg.SQLPollInterval > time.Minute) {
				err = fmt.Errorf("want a duration from 1ms to 1m, such as 100ms: %q", v)
			}
		case "kafka-brokers":
			cfg.KafkaBrokers, err = parseHostPorts(v)
		case "broker-database-url":
			if v != "" {
				err = validateDatabaseURL(v)
			}
			cfg.BrokerDatabaseURL = v
		case "audit-interval":
			cfg.AuditInterval, err = time.ParseDuration(v)
			if err == nil && cfg.AuditInterval >= 0 && cfg.AuditInterval < 10*time.Millisecond {
				err = fmt.Errorf("want a duration of at least 10ms, such as 20s, or a negative one to disable the audit: %q", v)
			}
		case "console-addr":
			cfg.ConsoleAddr, err = v, validateAddr(v)
		case "console-insecure-cookie":
			cfg.ConsoleInsecureCookie, err = strconv.ParseBool(v)
			if err != nil {
				err = fmt.Errorf("want true or false, not %q", v)
			} else if cfg.ConsoleInsecureCookie && !Loopback(cfg.ConsoleAddr) {
				err = fmt.Errorf("only with a loopback --console-addr (127.0.0.1, ::1, localhost), not %q: serve the console behind TLS", cfg.ConsoleAddr)
			}
		case "console-operator-key-sha256":
			if v != "" {
				cfg.ConsoleOperatorKeySHA256, err = hex.DecodeString(v)
				if err != nil || len(cfg.ConsoleOperatorKeySHA256) != sha256.Size {
					err = fmt.Errorf("want %d hex digits, the SHA-256 of the operator key (printf %%s \"$KEY\" | sha256sum | cut -d' ' -f1)", 2*sha256.Size)
				} else if empty := sha256.Sum256(nil); bytes.Equal(cfg.ConsoleOperatorKeySHA256, empty[:]) {
					// Only this one is known from the hash alone: the
					// key's strength cannot be checked, make it random.
					err = errors.New("that is the SHA-256 of an empty key: make the key of 32 random bytes (KEY=$(openssl rand -base64 32))")
				}
			}
		case "webhook-secret-grace":
			cfg.WebhookSecretGrace, err = time.ParseDuration(v)
			if err == nil && (cfg.WebhookSecretGrace < 0 || cfg.WebhookSecretGrace > 720*time.Hour) {
				err = fmt.Errorf("want a duration from 0s to 720h, such as 24h: %q", v)
			}
		}
		if err != nil {
			return Config{}, fmt.Errorf("invalid %s: %w", src, err)
		}
	}
	cfg.WebhookAllowPrivate = *f.allowPrivate
	if v, ok := os.LookupEnv(allowPrivateEnv); ok && v != "" && !f.fs.Changed(allowPrivateFlag) {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return Config{}, fmt.Errorf("invalid %s: want true or false, not %q", allowPrivateEnv, v)
		}
		cfg.WebhookAllowPrivate = b
	}
	if v, ok := os.LookupEnv(secretseal.KeyEnv); ok && v != "" {
		k, err := secretseal.ParseKey(v)
		if err != nil {
			return Config{}, fmt.Errorf("invalid %s: %w", secretseal.KeyEnv, err) // never the value
		}
		cfg.SecretKey = k
	}
	return cfg, nil
}

func validateDatabaseURL(v string) error {
	if !strings.HasPrefix(v, "postgres://") && !strings.HasPrefix(v, "postgresql://") {
		return fmt.Errorf("want a postgres:// URL")
	}
	// pgx redacts the password in its parse errors, but not every secret
	// parameter: the message goes through the redactor, and v never
	// appears whole.
	if _, err := pgxpool.ParseConfig(v); err != nil {
		return fmt.Errorf("cannot parse the URL: %s", redact.Text(err.Error(), v))
	}
	return nil
}

func validateRedisURL(v string) error {
	u, err := url.Parse(v)
	if err != nil {
		return fmt.Errorf("cannot parse the URL")
	}
	switch u.Scheme {
	case "redis", "rediss", "unix":
	default:
		return fmt.Errorf("want a redis://, rediss:// or unix:// URL, not %q", u.Scheme+"://")
	}
	if u.Scheme != "unix" && u.Host == "" {
		return fmt.Errorf("the URL has no host")
	}
	return nil
}

func validateNATSURL(v string) error {
	u, err := url.Parse(v)
	if err != nil {
		return fmt.Errorf("cannot parse the URL")
	}
	if u.Scheme != "nats" && u.Scheme != "tls" {
		return fmt.Errorf("want a nats:// or tls:// URL, not %q", u.Scheme+"://")
	}
	if u.Host == "" {
		return fmt.Errorf("the URL has no host")
	}
	return nil
}

func validateAMQPURL(v string) error {
	u, err := url.Parse(v)
	if err != nil {
		return fmt.Errorf("cannot parse the URL")
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return fmt.Errorf("want an amqp:// or amqps:// URL, not %q", u.Scheme+"://")
	}
	if u.Host == "" {
		return fmt.Errorf("the URL has no host")
	}
	return nil
}

func parseInt(v string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("want a whole number from %d to %d: %q", lo, hi, v)
	}
	return n, nil
}

// parseGroups reads topic=group,group[;topic=group...].
func parseGroups(v string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, part := range strings.Split(v, ";") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		topic, list, ok := strings.Cut(part, "=")
		topic = strings.TrimSpace(topic)
		if !ok || topic == "" {
			return nil, fmt.Errorf("want topic=group,group[;topic=group...]: %q", part)
		}
		if _, dup := out[topic]; dup {
			return nil, fmt.Errorf("topic %q listed twice", topic)
		}
		groups := []string{}
		for _, g := range strings.Split(list, ",") {
			if g = strings.TrimSpace(g); g == "" {
				return nil, fmt.Errorf("empty group name for topic %q", topic)
			}
			groups = append(groups, g)
		}
		out[topic] = groups
	}
	return out, nil
}

func parseHostPorts(v string) ([]string, error) {
	var out []string
	for _, hp := range strings.Split(v, ",") {
		hp = strings.TrimSpace(hp)
		if _, _, err := net.SplitHostPort(hp); err != nil || strings.Contains(hp, "@") {
			// Not echoed: a list entry may hold credentials (user:pass@host).
			return nil, fmt.Errorf("want host:port[,host:port...]: entry %d is not host:port", len(out)+1)
		}
		out = append(out, hp)
	}
	return out, nil
}

// BrokerConfig is the broker block the configuration names.
func (c Config) BrokerConfig(partitions int, logger *slog.Logger) brokers.Config {
	dbURL := c.BrokerDatabaseURL
	if dbURL == "" {
		dbURL = c.DatabaseURL
	}
	return brokers.Config{Kind: c.Broker, StreamPartitions: partitions, Logger: logger, CloudEvents: c.CloudEvents,
		Redis: brokers.RedisConfig{URL: c.RedisURL, Cluster: c.RedisCluster, WaitReplicas: c.RedisWaitReplicas, WaitTimeout: c.RedisWaitTimeout},
		NATS:  brokers.NATSConfig{URL: c.NATSURL, Replicas: c.NATSReplicas},
		AMQP:  brokers.AMQPConfig{URL: c.AMQPURL, Groups: c.AMQPGroups, MaxMessageBytes: c.AMQPMaxMessageBytes},
		Kafka: brokers.KafkaConfig{Brokers: c.KafkaBrokers, TopicPartitions: c.KafkaTopicPartitions},
		SQL:   brokers.SQLConfig{DatabaseURL: dbURL, PollInterval: c.SQLPollInterval}}
}

// Loopback reports whether addr's host is a loopback address: the only
// place the console may serve a cookie without Secure.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func validateAddr(v string) error {
	if _, _, err := net.SplitHostPort(v); err != nil {
		return fmt.Errorf("want host:port, such as 127.0.0.1:8080: %q", v)
	}
	return nil
}

func parseLevel(v string) (slog.Level, error) {
	var l slog.Level
	switch strings.ToLower(v) {
	case "debug":
		l = slog.LevelDebug
	case "info":
		l = slog.LevelInfo
	case "warn", "warning":
		l = slog.LevelWarn
	case "error":
		l = slog.LevelError
	default:
		return 0, fmt.Errorf("want debug, info, warn or error, not %q", v)
	}
	return l, nil
}

func validateLogFormat(v string) error {
	if v != "text" && v != "json" {
		return fmt.Errorf("want text or json, not %q", v)
	}
	return nil
}
