package config

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		args    []string
		wantErr string // substring; "" means success
		check   func(Config) bool
	}{
		{name: "defaults", check: func(c Config) bool { return c.DatabaseURL == DefaultDatabaseURL && c.HTTPAddr == DefaultHTTPAddr }},
		{name: "env wins over default", env: map[string]string{"HTTP_ADDR": "0.0.0.0:9000"}, check: func(c Config) bool { return c.HTTPAddr == "0.0.0.0:9000" }},
		{name: "flag wins over env", env: map[string]string{"HTTP_ADDR": "0.0.0.0:9000"}, args: []string{"--http-addr", "127.0.0.1:1"}, check: func(c Config) bool { return c.HTTPAddr == "127.0.0.1:1" }},
		{name: "bad log level names the variable", env: map[string]string{"LOG_LEVEL": "loud"}, wantErr: "invalid LOG_LEVEL"},
		{name: "bad flag names the flag", args: []string{"--log-level", "loud"}, wantErr: "invalid --log-level"},
		{name: "bad log format names the flag", args: []string{"--log-format", "xml"}, wantErr: "invalid --log-format"},
		{name: "bad LOG_FORMAT names the variable", env: map[string]string{"LOG_FORMAT": "xml"}, wantErr: "invalid LOG_FORMAT"},
		{name: "bad database URL", env: map[string]string{"DATABASE_URL": "mysql://x"}, wantErr: "invalid DATABASE_URL"},
		{name: "bad redis URL", env: map[string]string{"REDIS_URL": "http://x"}, wantErr: "invalid REDIS_URL"},
		{name: "bad addr", env: map[string]string{"HTTP_ADDR": "8080"}, wantErr: "invalid HTTP_ADDR"},
		{name: "amqp groups", args: []string{"--amqp-groups", "payments=a, b; refunds=c"}, check: func(c Config) bool {
			return len(c.AMQPGroups) == 2 && strings.Join(c.AMQPGroups["payments"], "|") == "a|b" && c.AMQPGroups["refunds"][0] == "c"
		}},
		{name: "amqp groups default", check: func(c Config) bool {
			return len(c.AMQPGroups) == 0 // the CLI adds its own handlers' groups; nothing names them here
		}},
		{name: "amqp groups without topic", env: map[string]string{"AMQP_GROUPS": "sync-analytics"}, wantErr: "invalid AMQP_GROUPS: want topic=group"},
		{name: "amqp groups empty group", args: []string{"--amqp-groups", "payments=a,,b"}, wantErr: "invalid --amqp-groups: empty group name"},
		{name: "tuning defaults", check: func(c Config) bool {
			return c.NATSReplicas == 1 && c.KafkaTopicPartitions == 8 && c.SQLPollInterval == 100*time.Millisecond
		}},
		{name: "tuning set", args: []string{"--nats-replicas", "3", "--kafka-topic-partitions", "32", "--sql-poll-interval", "250ms"}, check: func(c Config) bool {
			b := c.BrokerConfig(1, nil)
			return b.NATS.Replicas == 3 && b.Kafka.TopicPartitions == 32 && b.SQL.PollInterval == 250*time.Millisecond
		}},
		{name: "redis cluster and wait", env: map[string]string{"REDIS_CLUSTER": "true", "REDIS_WAIT_REPLICAS": "1"}, args: []string{"--redis-wait-timeout", "250ms"},
			check: func(c Config) bool {
				r := c.BrokerConfig(1, nil).Redis
				return r.Cluster && r.WaitReplicas == 1 && r.WaitTimeout == 250*time.Millisecond
			}},
		{name: "redis wait off by default", check: func(c Config) bool { return !c.RedisCluster && c.RedisWaitReplicas == 0 }},
		{name: "bad redis cluster", env: map[string]string{"REDIS_CLUSTER": "maybe"}, wantErr: "invalid REDIS_CLUSTER: want true or false"},
		{name: "bad wait replicas", args: []string{"--redis-wait-replicas", "-1"}, wantErr: "invalid --redis-wait-replicas"},
		{name: "bad wait timeout", env: map[string]string{"REDIS_WAIT_TIMEOUT": "0s"}, wantErr: "invalid REDIS_WAIT_TIMEOUT"},
		{name: "bad replicas", env: map[string]string{"NATS_REPLICAS": "7"}, wantErr: "invalid NATS_REPLICAS: want a whole number from 1 to 5"},
		{name: "bad partitions", args: []string{"--kafka-topic-partitions", "0"}, wantErr: "invalid --kafka-topic-partitions"},
		{name: "bad poll interval", args: []string{"--sql-poll-interval", "fast"}, wantErr: "invalid --sql-poll-interval"},
		{name: "console defaults", check: func(c Config) bool { return c.ConsoleAddr == DefaultConsoleAddr && !c.ConsoleInsecureCookie }},
		{name: "console insecure cookie on loopback", env: map[string]string{"CONSOLE_INSECURE_COOKIE": "true"}, args: []string{"--console-addr", "[::1]:9"},
			check: func(c Config) bool { return c.ConsoleAddr == "[::1]:9" && c.ConsoleInsecureCookie }},
		{name: "console insecure cookie refused off loopback", args: []string{"--console-addr", "0.0.0.0:8090", "--console-insecure-cookie", "true"},
			wantErr: "invalid --console-insecure-cookie: only with a loopback"},
		{name: "bad console addr", env: map[string]string{"CONSOLE_ADDR": "8090"}, wantErr: "invalid CONSOLE_ADDR"},
		{name: "no operator key by default", check: func(c Config) bool { return c.ConsoleOperatorKeySHA256 == nil }},
		{name: "operator key hash", args: []string{"--console-operator-key-sha256", strings.Repeat("ab", 32)}, check: func(c Config) bool {
			return len(c.ConsoleOperatorKeySHA256) == 32 && c.ConsoleOperatorKeySHA256[0] == 0xab
		}},
		{name: "short operator key hash", args: []string{"--console-operator-key-sha256", "abcd"},
			wantErr: "invalid --console-operator-key-sha256: want 64 hex digits"},
		{name: "not hex", env: map[string]string{"CONSOLE_OPERATOR_KEY_SHA256": strings.Repeat("zz", 32)},
			wantErr: "invalid CONSOLE_OPERATOR_KEY_SHA256: want 64 hex digits"},
		{name: "operator key hash in the environment", env: map[string]string{"CONSOLE_OPERATOR_KEY_SHA256": strings.Repeat("cd", 32)},
			check: func(c Config) bool {
				return len(c.ConsoleOperatorKeySHA256) == 32 && c.ConsoleOperatorKeySHA256[0] == 0xcd
			}},
		{name: "empty key's hash", env: map[string]string{"CONSOLE_OPERATOR_KEY_SHA256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
			wantErr: "invalid CONSOLE_OPERATOR_KEY_SHA256: that is the SHA-256 of an empty key"},
		{name: "cloudevents on by default", check: func(c Config) bool {
			ce := c.BrokerConfig(1, nil).CloudEvents
			return !ce.Disabled && ce.Source == "urn:outflow" && ce.DataSchema == ""
		}},
		{name: "cloudevents off", env: map[string]string{"OUTFLOW_CLOUDEVENTS": "false"}, check: func(c Config) bool { return c.BrokerConfig(1, nil).CloudEvents.Disabled }},
		{name: "cloudevents set", args: []string{"--cloudevents-source", "https://payments.example.com", "--cloudevents-dataschema", "https://s.example.com/{type}/v{version}.json", "--amqp-max-message-bytes", "4096"},
			check: func(c Config) bool {
				b := c.BrokerConfig(1, nil)
				return b.CloudEvents.Source == "https://payments.example.com" && b.CloudEvents.DataSchema == "https://s.example.com/{type}/v{version}.json" && b.AMQP.MaxMessageBytes == 4096
			}},
		{name: "bad cloudevents", args: []string{"--cloudevents", "sometimes"}, wantErr: "invalid --cloudevents: want true or false"},
		{name: "bad cloudevents source", args: []string{"--cloudevents-source", "my service"}, wantErr: "invalid --cloudevents-source: cloudevents config: Source \"my service\" is not a URI-reference"},
		{name: "bad cloudevents source env", env: map[string]string{"OUTFLOW_CLOUDEVENTS_SOURCE": "%zz"}, wantErr: "invalid OUTFLOW_CLOUDEVENTS_SOURCE"},
		{name: "relative dataschema", args: []string{"--cloudevents-dataschema", "/schemas/{type}"}, wantErr: "invalid --cloudevents-dataschema: cloudevents config: DataSchema \"/schemas/{type}\" does not give an absolute URI"},
		{name: "bad amqp max message bytes", args: []string{"--amqp-max-message-bytes", "-1"}, wantErr: "invalid --amqp-max-message-bytes"},
		{name: "audit defaults", check: func(c Config) bool { return c.AuditInterval == 20*time.Second }},
		{name: "audit off", env: map[string]string{"AUDIT_INTERVAL": "-1s"}, check: func(c Config) bool { return c.AuditInterval < 0 }},
		{name: "audit set", args: []string{"--audit-interval", "5s"}, check: func(c Config) bool {
			return c.AuditInterval == 5*time.Second
		}},
		{name: "bad audit interval", env: map[string]string{"AUDIT_INTERVAL": "0s"}, wantErr: "invalid AUDIT_INTERVAL"},
		{name: "webhook safety defaults", check: func(c Config) bool {
			return !c.WebhookAllowPrivate && c.SecretKey == nil && c.WebhookSecretGrace == 24*time.Hour
		}},
		{name: "allow private from env", env: map[string]string{"WEBHOOK_ALLOW_PRIVATE": "true"}, check: func(c Config) bool { return c.WebhookAllowPrivate }},
		{name: "allow private flag wins", env: map[string]string{"WEBHOOK_ALLOW_PRIVATE": "true"}, args: []string{"--webhook-allow-private=false"},
			check: func(c Config) bool { return !c.WebhookAllowPrivate }},
		{name: "allow private flag", args: []string{"--webhook-allow-private"}, check: func(c Config) bool { return c.WebhookAllowPrivate }},
		{name: "bad allow private", env: map[string]string{"WEBHOOK_ALLOW_PRIVATE": "perhaps"}, wantErr: "invalid WEBHOOK_ALLOW_PRIVATE"},
		{name: "grace", args: []string{"--webhook-secret-grace", "1h"}, check: func(c Config) bool { return c.WebhookSecretGrace == time.Hour }},
		{name: "bad grace", env: map[string]string{"WEBHOOK_SECRET_GRACE": "-1h"}, wantErr: "invalid WEBHOOK_SECRET_GRACE"},
		{name: "secret key", env: map[string]string{"OUTFLOW_SECRET_KEY": "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="},
			check: func(c Config) bool { return c.SecretKey != nil }},
		{name: "short secret key", env: map[string]string{"OUTFLOW_SECRET_KEY": "aHVudGVyMg=="}, wantErr: "invalid OUTFLOW_SECRET_KEY: want the base64 of 32 random bytes"},
		{name: "secret key not echoed", env: map[string]string{"OUTFLOW_SECRET_KEY": "hunter2"}, wantErr: "invalid OUTFLOW_SECRET_KEY"},
		{name: "secret not echoed", env: map[string]string{"DATABASE_URL": "postgres://u:hunter2@host:notaport/db"}, wantErr: "invalid DATABASE_URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{"DATABASE_URL", "REDIS_URL", "HTTP_ADDR", "LOG_LEVEL", "LOG_FORMAT", "AMQP_GROUPS", "NATS_REPLICAS",
				"WEBHOOK_ALLOW_PRIVATE", "WEBHOOK_SECRET_GRACE", "OUTFLOW_SECRET_KEY", "AUDIT_INTERVAL",
				"REDIS_CLUSTER", "REDIS_WAIT_REPLICAS", "REDIS_WAIT_TIMEOUT", "CONSOLE_ADDR", "CONSOLE_INSECURE_COOKIE",
				"CONSOLE_OPERATOR_KEY_SHA256", "OUTFLOW_CLOUDEVENTS", "OUTFLOW_CLOUDEVENTS_SOURCE", "OUTFLOW_CLOUDEVENTS_DATASCHEMA", "AMQP_MAX_MESSAGE_BYTES"} {
				t.Setenv(k, tt.env[k])
			}
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			f := Register(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			cfg, err := f.Load()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "hunter2") {
					t.Fatalf("error leaks the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if !tt.check(cfg) {
				t.Fatalf("unexpected config %+v", cfg)
			}
		})
	}
}

// The operator key's hash is given in the environment: the flag's help
// says why (ps shows a flag's value to every user of the machine) and how
// to make the key.
func TestOperatorKeyFlagSaysToUseTheEnvironment(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	Register(fs)
	usage := fs.Lookup("console-operator-key-sha256").Usage
	require.Contains(t, usage, "Set it in the environment: a flag's value is visible to other users of the machine (ps)")
	require.Contains(t, usage, "openssl rand -base64 32")
	require.Contains(t, usage, "(env CONSOLE_OPERATOR_KEY_SHA256)")
}
