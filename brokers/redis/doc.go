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
// one stream, or to StreamPartitions streams chosen by a hash of the aggregate id,
// so that consumers can scale out while each aggregate stays on one stream,
// in order.
//
// The client is a go-redis UniversalClient: a REDIS_URL naming a single
// server, a Sentinel set or a Cluster works alike (see [NewClient]).
//
// # Redis Cluster
//
// A URL with addr= parameters names a Cluster by several seed nodes
// (redis://node1:6379?addr=node2:6379&addr=node3:6379); one seed node is
// enough with [brokers.RedisConfig.Cluster] (--redis-cluster,
// REDIS_CLUSTER=true). A Cluster node given as a single server is refused
// at start ([ErrClusterNotConfigured]) rather than answering MOVED to every
// stream it does not hold; a Cluster URL with a database other than 0, a
// unix socket or a Sentinel master_name is refused too.
//
// Every command touches one key: XADD, XREADGROUP, XACK, XAUTOCLAIM, XINFO,
// XPENDING, XTRIM, XLEN, XRANGE each name one stream, so none spans slots,
// and a batch's pipeline is split by go-redis into one pipeline per primary
// (run concurrently; an aggregate's stream is on one primary, so its
// entries keep their order). A stream's slot is CRC16 of its whole name:
// the partitions of a topic ("payments.0" ... "payments.5") hash to
// unrelated slots and so spread over the primaries, by chance rather than
// by design (with 6 partitions on 3 primaries, all on one has a chance of
// 3/3^6, about 0.4%; TestCluster shows the layout of "payments"). Give a
// topic more partitions than the Cluster has primaries. Ping pings every
// primary: one that is down, until its replica takes over, fails readiness.
//
// # WAIT: marking only what a replica has
//
// Redis acknowledges an XADD once it is in the primary's memory;
// replication is asynchronous, so a primary that dies before its replica
// has an entry loses it in the failover, after the forwarder marked the row
// published. With [brokers.RedisConfig.WaitReplicas] n (--redis-wait-replicas),
// each batch ends with WAIT n WaitTimeout, in the same pipeline (same
// connection) as its XADDs; on a Cluster, the batch is split by the primary
// holding each stream (go-redis ClusterClient.MasterForKey) and each part is
// a pipeline on that primary's own client, ending with its WAIT, since
// WAIT counts the replicas of one connection's writes on one server. A
// part whose WAIT counts fewer than n replicas reports each of its
// entries as [forwarder.ErrBrokerUnavailable] and [ErrTooFewReplicas]: the
// forwarder burns no attempt, keeps the rows pending and writes them again
// (consumers deduplicate the second copy). While a primary has fewer than
// n replicas connected (its replica is down, or it is a replica promoted
// by a failover and the old primary has not come back), its partitions'
// rows wait: durability is chosen over progress. A failed part makes the
// Cluster client reload the slot layout before the retry. WAIT does not
// make the primary fsync, and a replica that acknowledged may itself die:
// it narrows the loss window to two machines failing together; the audit
// (docs/broker-loss.md) is what repairs a loss. Its cost, measured by
// outflow-bench wait, is in docs/benchmarks.md.
//
// Streams are never trimmed with MAXLEN, which drops entries whether or not
// a consumer group has read them; [Broker.Trim] removes only entries every
// consumer group has acknowledged.
package redis
