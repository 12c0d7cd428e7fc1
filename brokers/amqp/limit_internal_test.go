package amqp

import (
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

func TestDefaultMaxMessageBytesByVersion(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		version any
		want    int
	}{
		{"3.10.8", DefaultMaxMessageBytes3},
		{"3.13.7", DefaultMaxMessageBytes3},
		{"3.8.0", DefaultMaxMessageBytes3},
		{"3.7.28", hardMaxMessageBytes},
		{"4.0.2", DefaultMaxMessageBytes4},
		{"4.1.0", DefaultMaxMessageBytes4},
		{"", DefaultMaxMessageBytes4},
		{nil, DefaultMaxMessageBytes4},
		{"garbage", DefaultMaxMessageBytes4},
	} {
		conn := &amqp091.Connection{Properties: amqp091.Table{"version": tt.version}}
		if got := defaultMaxMessageBytes(conn); got != tt.want {
			t.Errorf("version %v: %d, want %d", tt.version, got, tt.want)
		}
	}
}
