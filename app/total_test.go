package app_test

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app"
)

func TestTotal(t *testing.T) {
	t.Parallel()
	max64 := app.TotalOf(math.MaxInt64)
	for _, tt := range []struct {
		name string
		got  app.Total
		want string
	}{
		{"zero", app.Total{}, "0"},
		{"one amount", app.TotalOf(app.MaxAmount), "1000000000000000"},
		{"past int64", max64.Add(1), "9223372036854775808"},
		{"past uint64", max64.Plus(max64).Add(2), "18446744073709551616"},
		{"2^63 amounts of 2^63-1", func() app.Total {
			x, err := app.ParseTotal("85070591730234615847396907784232501249") // (2^63-1)^2
			require.NoError(t, err)
			return x
		}(), "85070591730234615847396907784232501249"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.got.String())
			back, err := app.ParseTotal(tt.want)
			require.NoError(t, err)
			require.Equal(t, tt.got, back)
			js, err := json.Marshal(tt.got)
			require.NoError(t, err)
			require.Equal(t, tt.want, string(js))
			var fromJSON app.Total
			require.NoError(t, json.Unmarshal(js, &fromJSON))
			require.Equal(t, tt.got, fromJSON)
			var scanned app.Total
			require.NoError(t, scanned.Scan(tt.want))
			require.Equal(t, tt.got, scanned)
		})
	}
	require.Equal(t, 1, max64.Add(1).Cmp(max64))
	require.Equal(t, -1, max64.Cmp(max64.Add(1)))
	require.Equal(t, 0, max64.Cmp(app.TotalOf(math.MaxInt64)))
	n, ok := max64.Int64()
	require.True(t, ok)
	require.Equal(t, int64(math.MaxInt64), n)
	_, ok = max64.Add(1).Int64()
	require.False(t, ok)
	for _, bad := range []string{"-1", "1.5", "", "x", "340282366920938463463374607431768211456"} { // 2^128
		_, err := app.ParseTotal(bad)
		require.Error(t, err, bad)
	}
}

func ExampleTotal() {
	var sum app.Total
	for range 10_000 {
		sum = sum.Add(app.MaxAmount)
	}
	_, fits := sum.Int64()
	fmt.Println(sum, fits)
	// Output: 10000000000000000000 false
}
