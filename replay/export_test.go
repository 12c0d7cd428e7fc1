package replay

// PublishedCond is the condition that tells an outbox row o published.
const PublishedCond = publishedCond
