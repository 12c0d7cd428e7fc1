// Package retention is the one shape of Outflow's purges: a [Job] deletes
// what outlived its retention from its tables, one batch per short
// transaction ([Batch]) until nothing due is left, elected per schema and
// round by an advisory lock (package advisory) when it has one, on the
// periodic runner (package poll). A purge says what one batch deletes; the
// job does the cutoff, transactions, election, counts, logs and errors.
package retention
