package loadbench

import (
	"fmt"
	"image/color"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// series is one line of a chart panel.
type series struct {
	name  string
	value func(Sample) float64
	color color.Color
}

var (
	blue   = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	orange = color.RGBA{R: 255, G: 127, B: 14, A: 255}
	green  = color.RGBA{R: 44, G: 160, B: 44, A: 255}
	red    = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	grey   = color.Gray{Y: 170}
	purple = color.RGBA{R: 148, G: 103, B: 189, A: 255}
)

// WriteChart draws the run over time as a PNG: throughput, projector lag,
// CPU and memory, one panel each, with the run's steps marked.
func (r *Report) WriteChart(w io.Writer) error {
	mib := func(v int64) float64 { return float64(v) / (1 << 20) }
	panels := []struct {
		title, unit string
		lines       []series
	}{
		{"Throughput", "per second", []series{
			{"commands answered 202", func(s Sample) float64 { return s.Commands }, blue},
			{"feed pages read", func(s Sample) float64 { return s.Reads }, orange},
			{"read model events applied", func(s Sample) float64 { return s.ReadModelRate }, green},
			{"feeds events applied", func(s Sample) float64 { return s.FeedsRate }, red},
		}},
		{"Projector lag", "events behind the log", []series{
			{"read model", func(s Sample) float64 { return s.ReadModelLag }, green},
			{"feeds (applied)", func(s Sample) float64 { return s.FeedsLag }, red},
			{"feeds planner", plannerLag, orange},
		}},
		{"CPU", "cores", []series{
			{"machine", func(s Sample) float64 { return s.MachineCPU }, grey},
			{"feed process", func(s Sample) float64 { return s.ProcessCPU }, blue},
			{"Redis", func(s Sample) float64 { return s.RedisCPU }, red},
			{"NATS", func(s Sample) float64 { return s.NATSCPU }, orange},
			{"bench", func(s Sample) float64 { return s.BenchCPU }, green},
			{"anything else", Sample.OtherCPU, purple},
		}},
		{"Memory", "MiB", []series{
			{"Redis used_memory", func(s Sample) float64 { return mib(s.RedisMemory) }, red},
			{"service Go heap in use", func(s Sample) float64 { return mib(s.Heap) }, blue},
			{"service Go heap live", func(s Sample) float64 { return mib(s.HeapLive) }, purple},
			{"service resident", func(s Sample) float64 { return mib(s.RSS) }, grey},
			{"Postgres database", func(s Sample) float64 { return mib(s.PostgresSize) }, green},
			{"NATS server resident", func(s Sample) float64 { return mib(s.NATSMemory) }, orange},
		}},
	}
	plots := make([][]*plot.Plot, len(panels))
	for i, p := range panels {
		pl, err := r.panel(p.title, p.unit, p.lines)
		if err != nil {
			return err
		}
		plots[i] = []*plot.Plot{pl}
	}
	img := vgimg.New(12*vg.Inch, 14*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6),
		PadRight: vg.Points(12), PadY: vg.Points(14)}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("write chart: %w", err)
	}
	return nil
}

// panel is one chart panel; a series whose value is negative (unknown) in
// every sample is left out.
func (r *Report) panel(title, unit string, lines []series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "seconds since the stack was ready"
	p.Y.Label.Text = unit
	p.Y.Min = 0
	// The legend sits at the top, below the first row of step names, and
	// left of the names of the run's last steps.
	p.Legend.Top = true
	p.Legend.YOffs = -vg.Points(14)
	p.Legend.XOffs = -vg.Inch
	p.Add(plotter.NewGrid())
	top := 1.0
	for _, l := range lines {
		xys := make(plotter.XYs, 0, len(r.Samples))
		for _, s := range r.Samples {
			if v := l.value(s); v >= 0 && (s.Known || !isLag(title)) {
				xys = append(xys, plotter.XY{X: s.At.Seconds(), Y: v})
				top = max(top, v)
			}
		}
		if len(xys) == 0 {
			continue
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return nil, fmt.Errorf("chart %s: %w", title, err)
		}
		line.Color = l.color
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(l.name, line)
	}
	if err := r.markStages(p, top*1.4); err != nil {
		return nil, fmt.Errorf("chart %s: %w", title, err)
	}
	p.Y.Max = top * 1.45
	return p, nil
}

func isLag(title string) bool { return title == "Projector lag" }

// markStages draws a dashed line where each step of the run starts, named at
// the top.
func (r *Report) markStages(p *plot.Plot, top float64) error {
	var labels plotter.XYLabels
	prev := ""
	var rows labelRows
	if n := len(r.Samples); n > 0 {
		// A name takes about a ninth of the chart's width.
		rows.width = r.Samples[n-1].At.Seconds() / 9
	}
	for _, s := range r.Samples {
		if s.Stage == prev {
			continue
		}
		prev = s.Stage
		x := s.At.Seconds()
		line, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: top}})
		if err != nil {
			return err
		}
		line.Color = grey
		line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(line)
		// Each name on the highest row whose last name is far enough to the
		// left, so that the short steps at a run's start (raw limits, graph,
		// materialise, warm-up) and end (drain, reads) stay legible.
		row := rows.place(x)
		y := top * (1 - 0.08*float64(row))
		labels.XYs = append(labels.XYs, plotter.XY{X: x, Y: y})
		labels.Labels = append(labels.Labels, " "+s.Stage)
	}
	if len(labels.XYs) == 0 {
		return nil
	}
	l, err := plotter.NewLabels(labels)
	if err != nil {
		return err
	}
	p.Add(l)
	return nil
}

// labelRows places the names of the run's steps on rows: each on the
// highest row where it clears the last name by width, else on the row whose
// last name is furthest left.
type labelRows struct {
	width float64
	last  []float64 // the x of each row's last name
}

func (l *labelRows) place(x float64) int {
	best := -1
	for i, at := range l.last {
		if x-at >= l.width {
			l.last[i] = x
			return i
		}
		if best < 0 || at < l.last[best] {
			best = i
		}
	}
	if len(l.last) < 4 {
		l.last = append(l.last, x)
		return len(l.last) - 1
	}
	l.last[best] = x
	return best
}

// plannerLag is the planner's lag, or -1 (left out) when unknown.
func plannerLag(s Sample) float64 {
	if !s.KnownFanout {
		return -1
	}
	return s.PlannerLag
}
