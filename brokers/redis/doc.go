// Package redis is the Redis Streams backend, the default: the forwarder's
// broker ([Broker]), Outflow's batch subscriber ([Subscriber]) and the
// stream trimmer ([Broker.Trim], [Broker.TrimTopic]). Importing it registers
// the backend with package brokers, for [brokers.Open] with
// [brokers.Redis]; it links go-redis and watermill-redisstream only.
//
// Entries use watermill-redisstream's wire format (fields
// _watermill_message_uuid = the message id, metadata = the envelope in
// msgpack, payload = the event JSON), so watermill-redisstream's subscriber,
// and any Watermill user, reads them.
//
// A batch is one pipeline: one round trip whatever its size. A topic maps to
// one stream, or to Partitions streams chosen by a hash of the aggregate id,
// so that consumers can scale out while each aggregate stays on one stream,
// in order; on Redis Cluster, distinct streams land on distinct slots.
//
// The client is a go-redis UniversalClient: a REDIS_URL naming a single
// server, a Sentinel set or a Cluster works alike (see [NewClient]).
//
// Streams are never trimmed with MAXLEN, which drops entries whether or not
// a consumer group has read them; [Broker.Trim] removes only entries every
// consumer group has acknowledged.
package redis
