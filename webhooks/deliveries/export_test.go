package deliveries

// The two statements of a purge's transaction, for a test that
// interleaves two purges' transactions.
var (
	PurgeDeliveries = purgeDeliveries
	PurgeMessages   = purgeMessages
)
