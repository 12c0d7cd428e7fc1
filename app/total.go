package app

import (
	"errors"
	"fmt"
	"math/big"
	"math/bits"
	"strconv"
)

// MaxAmount caps every amount the service accepts, a payment's and a
// refund's: 10^15 minor units (ten trillion euros). It keeps each amount
// exact as a JSON number in any client (below 2^53), and it bounds every
// sum (see [Total]).
const MaxAmount int64 = 1_000_000_000_000_000

// Total is an exact, non-negative sum of amounts: what the analytics
// projection reports. It holds 128 bits, so it cannot wrap for any data the
// service can hold. The proof: every amount is at most 2^63-1 (a bigint;
// MaxAmount, below 2^50, for everything accepted since the cap), and a sum
// adds at most one amount per event, whose count is below 2^63 (events are
// numbered by a bigint), so a sum is below 2^126 (2^113 under the cap). The
// table holds the sums as numeric, which has no bound a sum can reach.
//
// It encodes as a plain JSON number: exact to clients that parse integers
// exactly, and to every client while it is below 2^53 (9,007 max-amount
// payments).
type Total struct{ hi, lo uint64 }

// errNegative rejects what no sum of amounts can be.
var errNegative = errors.New("a total of amounts cannot be negative")

// TotalOf returns n as a Total; n must not be negative.
func TotalOf(n int64) Total {
	if n < 0 {
		panic(errNegative)
	}
	return Total{lo: uint64(n)}
}

// Add returns t + n; n, an amount, must not be negative.
func (t Total) Add(n int64) Total { return t.Plus(TotalOf(n)) }

// Plus returns t + u. It cannot overflow for sums of amounts (see Total).
func (t Total) Plus(u Total) Total {
	lo, carry := bits.Add64(t.lo, u.lo, 0)
	hi, _ := bits.Add64(t.hi, u.hi, carry)
	return Total{hi: hi, lo: lo}
}

// Cmp returns -1, 0 or +1 as t is less than, equal to or greater than u.
func (t Total) Cmp(u Total) int {
	switch {
	case t.hi < u.hi || (t.hi == u.hi && t.lo < u.lo):
		return -1
	case t == u:
		return 0
	default:
		return 1
	}
}

// Int64 returns t as an int64, and whether it fits.
func (t Total) Int64() (int64, bool) {
	if t.hi != 0 || t.lo > 1<<63-1 {
		return 0, false
	}
	return int64(t.lo), true
}

func (t Total) big() *big.Int {
	b := new(big.Int).SetUint64(t.hi)
	b.Lsh(b, 64)
	return b.Or(b, new(big.Int).SetUint64(t.lo))
}

// String returns t in decimal.
func (t Total) String() string {
	if t.hi == 0 {
		return strconv.FormatUint(t.lo, 10)
	}
	return t.big().String()
}

// ParseTotal reads a decimal integer from 0 to 2^128-1.
func ParseTotal(s string) (Total, error) {
	b, ok := new(big.Int).SetString(s, 10)
	if !ok || b.Sign() < 0 || b.BitLen() > 128 {
		return Total{}, fmt.Errorf("parse total %q: want a whole number from 0 to 2^128-1", s)
	}
	lo := new(big.Int).And(b, new(big.Int).SetUint64(^uint64(0))).Uint64()
	hi := new(big.Int).Rsh(b, 64).Uint64()
	return Total{hi: hi, lo: lo}, nil
}

// MarshalJSON writes t as a JSON number.
func (t Total) MarshalJSON() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalJSON reads a JSON number holding a whole number.
func (t *Total) UnmarshalJSON(b []byte) error {
	v, err := ParseTotal(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}

// Scan reads a numeric or bigint column (database/sql's Scanner, which pgx
// also uses).
func (t *Total) Scan(src any) error {
	var (
		v   Total
		err error
	)
	switch s := src.(type) {
	case string:
		v, err = ParseTotal(s)
	case []byte:
		v, err = ParseTotal(string(s))
	case int64:
		if s < 0 {
			return fmt.Errorf("scan total: %w: %d", errNegative, s)
		}
		v = TotalOf(s)
	default:
		return fmt.Errorf("scan total: cannot read %T", src)
	}
	if err != nil {
		return fmt.Errorf("scan total: %w", err)
	}
	*t = v
	return nil
}
