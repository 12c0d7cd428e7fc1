package testservers

import (
	"os"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/outflow-dev/outflow/brokers"
)

// DefaultAMQPURL is the test RabbitMQ used when OUTFLOW_TEST_AMQP_URL is not
// set.
const DefaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/"

// AMQPURL returns the test RabbitMQ URL.
func AMQPURL() string {
	if u := os.Getenv("OUTFLOW_TEST_AMQP_URL"); u != "" {
		return u
	}
	return DefaultAMQPURL
}

// AMQPPrefix checks that the test RabbitMQ answers and returns a prefix for
// exchange and queue names no other test uses. When t ends it deletes the
// exchanges of groups' topics (each of its partitions) and the groups'
// queues on them, as the amqp backend names them with that prefix; AMQP
// cannot list them, so name every group a test subscribes.
func AMQPPrefix(t testing.TB, partitions int, groups map[string][]string) string {
	t.Helper()
	conn, err := amqp091.DialConfig(AMQPURL(), amqp091.Config{Dial: amqp091.DefaultDial(3 * time.Second)})
	if err != nil {
		t.Fatalf("outflowtest: RabbitMQ is not reachable at %s: %v\n"+
			"Start it with `make services-up` (rabbitmq-server), or point OUTFLOW_TEST_AMQP_URL at a server you run.", AMQPURL(), err)
	}
	prefix := "t" + randomHex(6) + "_"
	t.Cleanup(func() {
		defer conn.Close()
		for topic, gs := range groups {
			for _, exchange := range brokers.PartitionTopics(prefix, topic, partitions) {
				for _, g := range gs {
					deleteAMQP(t, conn, func(ch *amqp091.Channel) error {
						_, err := ch.QueueDelete(brokers.AMQPQueueName(exchange, g), false, false, false)
						return err
					})
				}
				deleteAMQP(t, conn, func(ch *amqp091.Channel) error { return ch.ExchangeDelete(exchange, false, false) })
			}
		}
	})
	return prefix
}

// deleteAMQP runs del on a channel of its own: a failed delete closes its
// channel.
func deleteAMQP(t testing.TB, conn *amqp091.Connection, del func(*amqp091.Channel) error) {
	ch, err := conn.Channel()
	if err != nil {
		t.Logf("outflowtest: RabbitMQ cleanup: %v", err)
		return
	}
	defer ch.Close()
	if err := del(ch); err != nil {
		t.Logf("outflowtest: RabbitMQ cleanup: %v", err)
	}
}
