package console

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"
)

// A chart is drawn on the server as inline SVG: no script, no library,
// nothing the Content-Security-Policy has to allow (the lines' colours
// come from the console's stylesheet, by class), and it reads without
// colour (each line has its own dash pattern, named in the legend) and
// without sight (the figure's caption states the figures in words).

// chartLine is one line of a chart: a value for each of the chart's
// Times (NaN where there is none, which leaves a gap).
type chartLine struct {
	Label  string
	Values []float64
}

// chartSpec is a chart: its lines over the time from From to To, in
// Unit. Points further apart than Gap are not joined (a period without
// calls is a gap, not a slope).
type chartSpec struct {
	Title    string
	Unit     string
	From, To time.Time
	Gap      time.Duration
	Times    []time.Time
	Lines    []chartLine
}

// The chart's geometry, in SVG user units (it scales to its box).
const (
	chartW, chartH = 600, 160
	padL, padR     = 84, 8
	padT, padB     = 8, 36
)

// lineDash is each line's dash pattern, by its index: solid, dashed, dotted.
var lineDash = []string{"", "6 3", "2 3"}

// renderChart draws c as an SVG element. Pure: the same spec gives the same
// markup. Every text in it is escaped.
func renderChart(c chartSpec) template.HTML {
	top := niceCeil(maxValue(c.Lines))
	span := c.To.Sub(c.From).Seconds()
	x := func(t time.Time) float64 {
		if span <= 0 {
			return padL
		}
		return padL + (chartW-padL-padR)*t.Sub(c.From).Seconds()/span
	}
	y := func(v float64) float64 { return padT + (chartH-padT-padB)*(1-v/top) }
	var b strings.Builder
	esc := template.HTMLEscapeString
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="%s"><title>%s</title>`, chartW, chartH, esc(c.Title), esc(c.Title))
	for _, v := range []float64{0, top / 2, top} {
		fmt.Fprintf(&b, `<line class="grid" x1="%d" x2="%d" y1="%.1f" y2="%.1f"/>`, padL, chartW-padR, y(v), y(v))
		fmt.Fprintf(&b, `<text class="axis" x="%d" y="%.1f" text-anchor="end">%s</text>`, padL-4, y(v)+4, esc(figure(v)+" "+c.Unit))
	}
	base := chartH - padB
	fmt.Fprintf(&b, `<text class="axis" x="%d" y="%d">%s</text>`, padL, base+14, esc(c.From.UTC().Format("15:04Z")))
	fmt.Fprintf(&b, `<text class="axis" x="%d" y="%d" text-anchor="end">%s</text>`, chartW-padR, base+14, esc(c.To.UTC().Format("15:04Z")))
	for i, l := range c.Lines {
		class := "l" + strconv.Itoa(i%len(lineDash))
		dash := lineDash[i%len(lineDash)]
		if dash != "" {
			dash = ` stroke-dasharray="` + dash + `"`
		}
		if d := pathOf(c, l, x, y); d != "" {
			fmt.Fprintf(&b, `<path class="%s" d="%s" fill="none" stroke-width="2" stroke-linecap="round"%s/>`, class, d, dash)
		}
		lx := padL + i*150
		fmt.Fprintf(&b, `<line class="%s" x1="%d" x2="%d" y1="%d" y2="%d" stroke-width="2"%s/>`, class, lx, lx+24, base+28, base+28, dash)
		fmt.Fprintf(&b, `<text class="axis" x="%d" y="%d">%s</text>`, lx+30, base+32, esc(l.Label))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// pathOf is a line's path: a move at each point after a gap, a segment
// otherwise, and a dot where a point stands alone (a tiny segment that the
// round line cap draws as a dot), so it shows.
func pathOf(c chartSpec, l chartLine, x func(time.Time) float64, y func(float64) float64) string {
	var d strings.Builder
	var prev time.Time
	run := 0 // points in the current piece of the line
	end := func() {
		if run == 1 {
			d.WriteString("h0.1")
		}
		run = 0
	}
	for i, v := range l.Values {
		if i >= len(c.Times) || math.IsNaN(v) {
			end()
			prev = time.Time{}
			continue
		}
		t := c.Times[i]
		if run > 0 && t.Sub(prev) <= c.Gap {
			fmt.Fprintf(&d, "L%.1f %.1f", x(t), y(v))
		} else {
			end()
			fmt.Fprintf(&d, "M%.1f %.1f", x(t), y(v))
		}
		run++
		prev = t
	}
	end()
	return d.String()
}

// maxValue is the largest value of the lines (0 when none).
func maxValue(lines []chartLine) float64 {
	m := 0.0
	for _, l := range lines {
		for _, v := range l.Values {
			if !math.IsNaN(v) && v > m {
				m = v
			}
		}
	}
	return m
}

// niceCeil is the smallest of 1, 2 and 5 times a power of ten at or above
// v (1 for v ≤ 0), for the top of a chart's scale.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// figure prints a scale's value briefly: 0.5, 20, 1500.
func figure(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }
