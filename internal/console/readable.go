package console

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"time"
)

// What a person reads at 3 a.m.: a time in a stated zone (UTC, to the
// second) with its age beside it, a duration in the units that fit it
// (2h 0m, not 7200.0s), counts with thousands separators. The exact value
// stays in the markup (a time's datetime and title) for whoever needs it.

// displayLayout is how a time is written on every page; the zone is
// stated, always UTC: operators of one service in several zones read the
// same clock.
const displayLayout = "2006-01-02 15:04:05 UTC"

// timeHTML is t as a <time> element: absolute, then its age relative to
// now ("3 min ago", "in 20 s" for a time ahead, such as a lease's end).
func timeHTML(t, now time.Time) template.HTML {
	if t.IsZero() {
		return ""
	}
	t = t.UTC()
	return template.HTML(fmt.Sprintf(`<time datetime="%s" title="%s">%s</time> <span class="ago">(%s)</span>`,
		t.Format(time.RFC3339Nano), t.Format("2006-01-02 15:04:05.000000 UTC"), t.Format(displayLayout),
		template.HTMLEscapeString(relative(t, now))))
}

// relative is t's distance from now in words: "just now", "42 s ago",
// "in 3 min".
func relative(t, now time.Time) string {
	d := now.Sub(t)
	switch {
	case d > -time.Second && d < time.Second:
		return "just now"
	case d < 0:
		return "in " + coarse(-d)
	default:
		return coarse(d) + " ago"
	}
}

// coarse is d to one or two units, for an age: 42 s, 3 min, 2 h 5 min,
// 3 d 4 h.
func coarse(d time.Duration) string {
	s := int64(d / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%d s", s)
	case s < 3600:
		return fmt.Sprintf("%d min", s/60)
	case s < 86400:
		if m := s % 3600 / 60; m != 0 {
			return fmt.Sprintf("%d h %d min", s/3600, m)
		}
		return fmt.Sprintf("%d h", s/3600)
	default:
		if h := s % 86400 / 3600; h != 0 {
			return fmt.Sprintf("%d d %d h", s/86400, h)
		}
		return fmt.Sprintf("%d d", s/86400)
	}
}

// duration writes a duration given in seconds in its units: 0 s, 850 ms,
// 4.2 s, 3 min 20 s, 2 h 0 min, 3 d 4 h.
func duration(seconds float64) string {
	if seconds <= 0 || math.IsNaN(seconds) {
		return "0 s"
	}
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < 10*time.Second:
		return fmt.Sprintf("%.1f s", seconds)
	case d < time.Minute:
		return fmt.Sprintf("%d s", int64(seconds))
	case d < time.Hour:
		return fmt.Sprintf("%d min %d s", int64(seconds)/60, int64(seconds)%60)
	}
	return coarse(d)
}

// thousands writes n with a comma between each group of three digits.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	out := make([]byte, 0, len(s)+len(s)/3+1)
	if neg {
		out = append(out, '-')
	}
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// plural is n and the noun that agrees with it: "1 row", "1,204 rows".
func plural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return thousands(n) + " " + many
}

// templateFuncs are the pages' functions; now is the console's clock.
func templateFuncs(now func() time.Time) template.FuncMap {
	return template.FuncMap{
		"ts": func(t any) template.HTML {
			switch v := t.(type) {
			case time.Time:
				return timeHTML(v, now())
			case *time.Time:
				if v != nil {
					return timeHTML(*v, now())
				}
			}
			return ""
		},
		"dur":           duration,
		"endpointState": endpointStateOf,
		"num": func(n any) string {
			switch v := n.(type) {
			case int:
				return thousands(int64(v))
			case int32:
				return thousands(int64(v))
			case int64:
				return thousands(v)
			}
			return fmt.Sprint(n)
		},
	}
}
