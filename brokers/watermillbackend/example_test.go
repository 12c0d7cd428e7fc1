package watermillbackend_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/brokers/watermillbackend"
	"github.com/outflow-dev/outflow/brokers/watermillpub"
	"github.com/outflow-dev/outflow/forwarder"
)

// A persistent GoChannel, both sides of a Backend: the forwarder publishes
// through Broker, and each consumer group (a consumer.Worker's handler)
// reads every message through Subscriber. The backend does not close the
// GoChannel: its owner does, after the Backend.
func ExampleNew_goChannel() {
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	defer pubSub.Close()
	backend, err := watermillbackend.New(watermillbackend.Config{
		Publish:    watermillpub.Config{Publisher: pubSub},
		Subscriber: pubSub,
	})
	if err != nil {
		panic(err)
	}
	defer backend.Close()
	// consumer.WorkerConfig{Broker: backend, ...} and
	// forwarder.Config{Broker: backend.Broker(), ...} use it; here, by hand.
	var batch []forwarder.Outgoing
	for i := range 3 {
		batch = append(batch, forwarder.Outgoing{Topic: "payments", AggregateID: "p-1",
			Message: message.NewMessage(fmt.Sprint("m-", i), []byte(fmt.Sprintf(`{"version":%d}`, i+1)))})
	}
	for _, err := range backend.Broker().Publish(context.Background(), batch) {
		if err != nil {
			panic(err)
		}
	}
	// Published before the group subscribed: a persistent GoChannel keeps
	// it, and the group gets it in the order it was published.
	for _, group := range []string{"ledger", "mailer"} {
		sub, err := backend.Subscriber(group, "instance-1", brokers.SubscriberOptions{})
		if err != nil {
			panic(err)
		}
		msgs, err := sub.Subscribe(context.Background(), backend.Topics("payments")[0])
		if err != nil {
			panic(err)
		}
		for range batch {
			m := <-msgs
			m.Ack()
			fmt.Println(group, m.UUID, string(m.Payload))
		}
		sub.Close() // this group's subscriptions only
	}
	// A GoChannel that is not persistent is refused: it would drop what
	// is published before a group subscribes, while the outbox marks it
	// published.
	lossy := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer lossy.Close()
	_, err = watermillbackend.New(watermillbackend.Config{Publish: watermillpub.Config{Publisher: lossy}, Subscriber: lossy})
	fmt.Println(errors.Is(err, watermillbackend.ErrLosesMessages))
	// Output:
	// ledger m-0 {"version":1}
	// ledger m-1 {"version":2}
	// ledger m-2 {"version":3}
	// mailer m-0 {"version":1}
	// mailer m-1 {"version":2}
	// mailer m-2 {"version":3}
	// true
}
