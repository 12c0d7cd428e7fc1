package watermillpub_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outflow-dev/outflow/brokers/watermillpub"
	"github.com/outflow-dev/outflow/forwarder"
)

// Any Watermill publisher becomes the forwarder's broker (gochannel here,
// to run without a server; it keeps nothing, so it is no broker for
// production: see the package documentation).
func ExampleNew() {
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer pubSub.Close()
	received, err := pubSub.Subscribe(context.Background(), "payments")
	if err != nil {
		panic(err)
	}

	broker, err := watermillpub.New(watermillpub.Config{Publisher: pubSub})
	if err != nil {
		panic(err)
	}
	// forwarder.Config{Broker: broker, ...} publishes through it; here, by hand.
	errs := broker.Publish(context.Background(), []forwarder.Outgoing{
		{Topic: "payments", AggregateID: "p-1", Message: message.NewMessage("m-1", []byte(`{"amount":100}`))},
	})
	fmt.Println("result:", errs[0])
	m := <-received
	m.Ack()
	fmt.Println(m.UUID, string(m.Payload))
	// Output:
	// result: <nil>
	// m-1 {"amount":100}
}
