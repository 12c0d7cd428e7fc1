package console

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"
)

// The overview's charts of the last hour, drawn on the server as inline
// SVG (no script, no library): a polyline per series over a fixed hour,
// with its axes labelled in their units, and a title and description for
// readers that do not see it.

// Geometry of a chart, in the SVG's user units; it scales to its box.
const (
	chartW, chartH         = 420, 180
	plotX0, plotX1         = 52, 410
	plotY0, plotY1         = 12, 150
	chartBuckets           = 180 // the points of a series at most: one per 20 s of the hour
	chartMinPoints         = 2
	chartTimeLayout        = "15:04"
	chartTimeLayoutSeconds = "15:04:05"
)

var seriesColors = []string{"#1f5fbf", "#b3261e", "#b8860b", "#2e7d32", "#6a1b9a", "#00838f", "#5d4037", "#c2185b"}

type chartPoint struct {
	at time.Time
	v  float64
}

type series struct {
	Name   string
	Color  string
	Now    string // the newest value, as read
	points []chartPoint
}

type chart struct {
	ID, Title string
	Unit      string               // of the y axis, named in the caption: "events/s"
	unit      func(float64) string // a value with its unit, for the description
	Series    []series
	from, to  time.Time
	since     time.Time // the oldest sample; zero: none
	every     time.Duration
	svg       template.HTML // drawn once, when the chart is made
}

// chartStep is what the charts' end is rounded up to: renders within the
// same step draw the same charts, which are drawn once (chartCache).
const chartStep = 10 * time.Second

// chartCache holds the charts last drawn and what they were drawn from:
// every open overview refreshes every 2 s, the samples change every 5 s.
type chartCache struct {
	to, newest time.Time
	n          int
	charts     []chart
}

// cachedCharts are the charts of history up to now (rounded up to
// chartStep), drawn again only when the samples or the step changed.
func (c *Console) cachedCharts(history []sample, now time.Time) []chart {
	to := now.Truncate(chartStep)
	if to.Before(now) {
		to = to.Add(chartStep)
	}
	var newest time.Time
	if n := len(history); n > 0 {
		newest = history[n-1].snap.At
	}
	c.mu.Lock()
	cc := c.health.charts
	c.mu.Unlock()
	if cc.charts != nil && cc.to.Equal(to) && cc.n == len(history) && cc.newest.Equal(newest) {
		return cc.charts
	}
	charts := c.charts(history, to)
	c.mu.Lock()
	c.health.charts = chartCache{to: to, newest: newest, n: len(history), charts: charts}
	c.mu.Unlock()
	return charts
}

// charts are the overview's: published rate, lag per consumer, failures.
func (c *Console) charts(history []sample, now time.Time) []chart {
	from := now.Add(-historyWindow)
	var since time.Time
	if len(history) > 0 {
		since = history[0].snap.At
	}
	base := chart{from: from, to: now, since: since, every: c.cfg.RateSampleInterval}

	rate := base
	rate.ID, rate.Title, rate.Unit, rate.unit = "chart-rate", "Published rate", "events/s", func(v float64) string { return rateText(v) }
	s := series{Name: "published", Color: seriesColors[0]}
	for i := 1; i < len(history); i++ {
		a, b := history[i-1], history[i]
		el := b.snap.At.Sub(a.snap.At).Seconds()
		// A total that went down (partitions recreated, counters reset)
		// says nothing of the interval, as rateOver.
		if !a.publishedOK || !b.publishedOK || el <= 0 || b.published < a.published {
			continue
		}
		s.points = append(s.points, chartPoint{b.snap.At, float64(b.published-a.published) / el})
	}
	if n := len(s.points); n > 0 {
		s.Now = rateText(s.points[n-1].v)
	}
	rate.Series = []series{s}

	lag := base
	lag.ID, lag.Title, lag.Unit, lag.unit = "chart-lag", "Consumer lag", "events", func(v float64) string { return countText(v, "events") }
	byName := make(map[string]int, len(c.cfg.Consumers))
	for i, cs := range c.cfg.Consumers {
		byName[cs.Name] = i
		lag.Series = append(lag.Series, series{Name: cs.Name, Color: seriesColors[i%len(seriesColors)],
			points: make([]chartPoint, 0, len(history))})
	}
	for _, h := range history {
		for _, hc := range h.snap.Consumers {
			if i, ok := byName[hc.Name]; ok && hc.Lag != nil {
				lag.Series[i].points = append(lag.Series[i].points, chartPoint{h.snap.At, float64(hc.Lag.Events)})
			}
		}
	}
	for i := range lag.Series {
		if p := lag.Series[i].points; len(p) > 0 {
			lag.Series[i].Now = countText(p[len(p)-1].v, "events")
		}
	}

	fail := base
	fail.ID, fail.Title, fail.Unit, fail.unit = "chart-failures", "Failures", "rows", func(v float64) string { return countText(v, "rows") }
	parked := series{Name: "parked outbox rows", Color: seriesColors[2]}
	dead := series{Name: "dead letters", Color: seriesColors[1]}
	hooks := series{Name: "failing webhooks", Color: seriesColors[5]}
	for _, h := range history {
		if o := h.snap.Outbox; o != nil {
			parked.points = append(parked.points, chartPoint{h.snap.At, float64(o.Parked)})
		}
		var n int64
		known := false
		for _, hc := range h.snap.Consumers {
			if hc.DeadKnown {
				n, known = n+hc.Dead, true
			}
		}
		if known || len(h.snap.Consumers) == 0 {
			dead.points = append(dead.points, chartPoint{h.snap.At, float64(n)})
		}
		if w := h.snap.Webhooks; w != nil {
			hooks.points = append(hooks.points, chartPoint{h.snap.At, float64(w.Failing)})
		}
	}
	fail.Series = []series{parked, dead}
	if !c.cfg.FrameworkOnly {
		fail.Series = append(fail.Series, hooks)
	}
	for i := range fail.Series {
		if p := fail.Series[i].points; len(p) > 0 {
			fail.Series[i].Now = countText(p[len(p)-1].v, "")
		}
	}
	out := []chart{rate, lag, fail}
	for i := range out {
		out[i].svg = out[i].draw()
	}
	return out
}

func rateText(v float64) string {
	if v < 10 && v != math.Trunc(v) {
		return fmt.Sprintf("%.1f/s", v)
	}
	return thousands(int64(math.Round(v))) + "/s"
}

// countText is a count on a chart: a scale's half of 1 is 0.5.
func countText(v float64, unit string) string {
	s := thousands(int64(math.Round(v)))
	if v != math.Trunc(v) && v < 10 {
		s = fmt.Sprintf("%.1f", v)
	}
	if unit != "" {
		s += " " + unit
	}
	return s
}

// Collecting is the note under a chart whose samples do not cover the
// hour yet: "collecting since 00:12:05 UTC", "" once they do.
func (ch chart) Collecting() string {
	switch {
	case ch.since.IsZero():
		return fmt.Sprintf("No sample yet: the console samples every %s while it runs.", coarse(ch.every))
	case ch.since.After(ch.from):
		return "Collecting since " + ch.since.UTC().Format(chartTimeLayoutSeconds) + " UTC."
	}
	return ""
}

// enough: some series has the points to draw a line.
func (ch chart) enough() bool {
	for _, s := range ch.Series {
		if len(s.points) >= chartMinPoints {
			return true
		}
	}
	return false
}

// label is a value on the y axis: its number, the unit being in the
// caption ("20k" for 20,000, so that it fits the margin).
func (ch chart) label(v float64) string {
	switch {
	case v >= 1e6:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e6), ".0") + "M"
	case v >= 1e4:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e3), ".0") + "k"
	}
	return countText(v, "")
}

// SVG is the chart, drawn.
func (ch chart) SVG() template.HTML { return ch.svg }

// draw draws the chart as inline SVG.
func (ch chart) draw() template.HTML {
	var b strings.Builder
	esc := template.HTMLEscapeString
	top := 0.0
	for _, s := range ch.Series {
		for _, p := range s.points {
			top = max(top, p.v)
		}
	}
	top = niceCeil(top)
	// What a screen reader says: the chart's newest values and highest.
	var desc []string
	for _, s := range ch.Series {
		if s.Now != "" {
			desc = append(desc, s.Name+" now "+s.Now)
		}
	}
	summary := fmt.Sprintf("%s over the last hour, from %s to %s UTC", ch.Title,
		ch.from.UTC().Format(chartTimeLayout), ch.to.UTC().Format(chartTimeLayout))
	if len(desc) > 0 {
		summary += ": " + strings.Join(desc, ", ") + "; scale up to " + ch.unit(top)
	}
	if !ch.enough() {
		summary += ". Too few samples to draw yet."
	}
	fmt.Fprintf(&b, `<svg class="chart" id="%s-svg" viewBox="0 0 %d %d" role="img" aria-labelledby="%s-title %s-desc" preserveAspectRatio="xMidYMid meet">`,
		ch.ID, chartW, chartH, ch.ID, ch.ID)
	fmt.Fprintf(&b, `<title id="%s-title">%s</title><desc id="%s-desc">%s</desc>`, ch.ID, esc(ch.Title), ch.ID, esc(summary))
	// Axes and grid: zero, half and the top of the scale; the hour's
	// start, middle and end.
	for _, f := range []float64{0, 0.5, 1} {
		y := plotY1 - f*(plotY1-plotY0)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#d8dde2" stroke-width="1"/>`, plotX0, y, plotX1, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" font-size="13" fill="#66707a">%s</text>`, plotX0-4, y+4, esc(ch.label(f*top)))
	}
	for _, f := range []float64{0, 0.5, 1} {
		x := plotX0 + f*(plotX1-plotX0)
		at := ch.from.Add(time.Duration(f * float64(ch.to.Sub(ch.from))))
		anchor := map[float64]string{0: "start", 0.5: "middle", 1: "end"}[f]
		label := at.UTC().Format(chartTimeLayout)
		if f == 1 {
			label += " UTC"
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="%s" font-size="13" fill="#66707a">%s</text>`, x, chartH-8, anchor, label)
	}
	if !ch.enough() {
		note := "No sample yet"
		if !ch.since.IsZero() {
			note = "Too few samples yet: collecting since " + ch.since.UTC().Format(chartTimeLayoutSeconds) + " UTC"
		}
		fmt.Fprintf(&b, `<text class="chart-empty" x="%d" y="%d" text-anchor="middle" font-size="13" fill="#66707a">%s</text>`,
			(plotX0+plotX1)/2, (plotY0+plotY1)/2, esc(note))
	}
	span := ch.to.Sub(ch.from).Seconds()
	for _, s := range ch.Series {
		pts := bucket(s.points, ch.from, ch.to)
		if len(pts) == 0 {
			continue
		}
		xy := make([]byte, 0, len(pts)*12)
		for i, p := range pts {
			if i > 0 {
				xy = append(xy, ' ')
			}
			xy = strconv.AppendFloat(xy, plotX0+p.at.Sub(ch.from).Seconds()/span*(plotX1-plotX0), 'f', 1, 64)
			xy = append(xy, ',')
			xy = strconv.AppendFloat(xy, plotY1-p.v/top*(plotY1-plotY0), 'f', 1, 64)
		}
		fmt.Fprintf(&b, `<polyline class="series" data-series="%s" fill="none" stroke="%s" stroke-width="2" stroke-linejoin="round" points="%s"/>`,
			esc(s.Name), s.Color, xy)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // every text in it is escaped above
}

// bucket keeps the points within [from, to], at most chartBuckets of them:
// the highest of each bucket of time, so that a spike stays visible.
func bucket(pts []chartPoint, from, to time.Time) []chartPoint {
	width := to.Sub(from) / chartBuckets
	var out []chartPoint
	cur := -1
	for _, p := range pts {
		if p.at.Before(from) || p.at.After(to) {
			continue
		}
		k := int(p.at.Sub(from) / width)
		if k == cur && len(out) > 0 {
			if p.v > out[len(out)-1].v {
				out[len(out)-1].v = p.v
			}
			continue
		}
		cur = k
		out = append(out, p)
	}
	return out
}

// niceCeil is the least of 1, 2, 2.5, 5 times a power of ten not below v
// (1 for 0): the top of a chart's scale.
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
