// Package brokertest is the conformance suite of the forwarder's broker
// contract ([forwarder.Broker]): what a broker must do for the outbox's
// guarantees to hold. Every backend Outflow ships runs it (redis, nats,
// amqp, kafka, sql), as do brokers.Tee and the Watermill adapters
// (brokers/watermillpub, brokers/watermillbackend over a GoChannel and
// watermill-sql); run it on a broker of your own.
//
// [Run] checks per-message results, outages reported as
// [forwarder.ErrBrokerUnavailable] and recovered from, per-aggregate order
// through the real forwarder, payload limits ([forwarder.PayloadLimiter]),
// and, where the broker can refuse one message and take the next, that a
// refusal holds back only its aggregate. It needs the test PostgreSQL that
// package outflowtest uses (OUTFLOW_TEST_DATABASE_URL, default
// postgres://postgres@127.0.0.1:5432/outflow_test): the forwarder runs over
// a real outbox in a schema of its own.
//
// A test of your own broker gives a [Harness]: how to open the broker on
// fresh names, how to read what it published, and how to cut it off. For a
// backend registered with package brokers, [BackendTarget] does the
// reading with the backend's own subscriber:
//
//	func TestMyBrokerContract(t *testing.T) {
//		brokertest.Run(t, brokertest.Harness{
//			Open: func(t *testing.T) brokertest.Target {
//				b, err := brokers.Open(context.Background(), brokers.Config{Kind: "mybroker" /* ... */})
//				if err != nil {
//					t.Fatal(err)
//				}
//				t.Cleanup(func() { b.Close() })
//				return brokertest.BackendTarget(t, b)
//			},
//			Outage: func(t *testing.T) (brokertest.Target, testservers.Outage) {
//				proxy := testservers.StartProxy(t, "127.0.0.1:7000") // in front of your broker
//				b, err := brokers.Open(context.Background(), brokers.Config{Kind: "mybroker" /* at proxy.Addr */})
//				if err != nil {
//					t.Fatal(err)
//				}
//				t.Cleanup(func() { b.Close() })
//				return brokertest.BackendTarget(t, b), proxy
//			},
//		})
//	}
//
// For a bare [forwarder.Broker] (a Watermill publisher behind
// brokers/watermillpub, say), fill [Target] yourself: Broker, and Subscribe
// reading what it published with any subscriber of that broker, as consumer
// group [Group]. brokers/watermillpub's test is a complete example.
//
// A backend that is a [brokers.LagReporter] and a [brokers.Pinger] runs
// [RunObserve] too: the lag a group's acks leave, and Ping through an
// outage.
package brokertest
