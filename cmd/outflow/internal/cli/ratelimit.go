package cli

import (
	"fmt"
	"math"
	"os"
	"strconv"

	"github.com/spf13/pflag"

	"github.com/outflow-dev/outflow/app/httpapi"
)

// rateLimitFlags are serve's --rate-limit and --rate-burst, each with an
// environment variable; the flag wins.
type rateLimitFlags struct {
	fs        *pflag.FlagSet
	perSecond float64
	burst     int
}

func addRateLimitFlags(fs *pflag.FlagSet) *rateLimitFlags {
	f := &rateLimitFlags{fs: fs}
	fs.Float64Var(&f.perSecond, "rate-limit", httpapi.DefaultRateLimit.PerSecond,
		"requests per second each API key may send on average, over the API role's process (0: no limit; env RATE_LIMIT)")
	fs.IntVar(&f.burst, "rate-burst", httpapi.DefaultRateLimit.Burst,
		"requests an API key may send at once before --rate-limit applies (env RATE_BURST)")
	return f
}

// load resolves the flags against RATE_LIMIT and RATE_BURST and validates
// them, naming the source of a bad value.
func (f *rateLimitFlags) load() (httpapi.RateLimit, error) {
	r := httpapi.RateLimit{PerSecond: f.perSecond, Burst: f.burst}
	src := map[string]string{"rate-limit": "--rate-limit", "rate-burst": "--rate-burst"}
	if v, ok := os.LookupEnv("RATE_LIMIT"); ok && v != "" && !f.fs.Changed("rate-limit") {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return r, fmt.Errorf("invalid RATE_LIMIT: want a number of requests per second, such as 50 (0: no limit), not %q", v)
		}
		r.PerSecond, src["rate-limit"] = n, "RATE_LIMIT"
	}
	if v, ok := os.LookupEnv("RATE_BURST"); ok && v != "" && !f.fs.Changed("rate-burst") {
		n, err := strconv.Atoi(v)
		if err != nil {
			return r, fmt.Errorf("invalid RATE_BURST: want a whole number of requests, such as 100, not %q", v)
		}
		r.Burst, src["rate-burst"] = n, "RATE_BURST"
	}
	if r.PerSecond < 0 || math.IsNaN(r.PerSecond) || math.IsInf(r.PerSecond, 0) {
		return r, fmt.Errorf("invalid %s: must be a number >= 0 (0: no limit)", src["rate-limit"])
	}
	if r.PerSecond > 0 && r.Burst < 1 {
		return r, fmt.Errorf("invalid %s: must be at least 1 while the rate limit is on", src["rate-burst"])
	}
	if r.PerSecond == 0 {
		r.Burst = 0 // off
	}
	return r, nil
}
