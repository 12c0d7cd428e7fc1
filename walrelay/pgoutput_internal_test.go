package walrelay

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
)

// Records as PostgreSQL 15's pgoutput sent them (proto_version 1,
// messages true) for two transactions that each emitted one message; the
// second transaction's commit is missing, as if the read stopped there.
func TestTxnAssembler(t *testing.T) {
	t.Parallel()
	var a txnAssembler
	for _, h := range []string{
		"420000000001511f30000304ccefb0651c000002d6",
		"4d010000000001511f306f7574666c6f7700000000077b2261223a317d",
		"43000000000001511f300000000001511f60000304ccefb0651c",
		"4200000000015284a8000304ccefb08e5e000002d9",
		"4d0100000000015284a86f7574666c6f7700000000077b2262223a317d",
	} {
		b, err := hex.DecodeString(h)
		require.NoError(t, err)
		require.NoError(t, a.add(b))
	}
	require.Len(t, a.done, 1, "a transaction without its commit is not complete")
	tx := a.done[0]
	require.EqualValues(t, 726, tx.xid)
	require.Equal(t, "0/1511F30", tx.commitLSN.String())
	require.Equal(t, "0/1511F60", tx.end.String())
	require.Len(t, tx.messages, 1)
	require.Equal(t, "outflow", tx.messages[0].prefix)
	require.Equal(t, `{"a":1}`, string(tx.messages[0].content))

	require.ErrorIs(t, a.add([]byte{'C', 0}), errProtocol)
	require.ErrorIs(t, a.add(nil), errProtocol)
}
