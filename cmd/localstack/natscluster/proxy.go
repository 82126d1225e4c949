package natscluster

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from a loopback port to a target and can cut
// them all at once, as a network does: what either side sent and the other
// has not read yet is lost. It keeps accepting new connections after a cut.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	links  map[*link]struct{}
	closed bool
	armed  *trap
	wg     sync.WaitGroup
}

// trap is a cut waiting for data from the target that holds marker.
type trap struct {
	marker []byte
	sprung chan struct{}
}

// link is one proxied connection: the client's side and the target's.
type link struct {
	client, target net.Conn
	once           sync.Once
}

// cut resets both sides: a close with no linger sends a reset, so that data
// still in the sockets' buffers is dropped instead of delivered.
func (l *link) cut() {
	l.once.Do(func() {
		for _, c := range []net.Conn{l.client, l.target} {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = c.Close()
		}
	})
}

// NewProxy listens on a random loopback port and forwards to target (a
// host:port). Cleanup closes it and every connection.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("natscluster: proxy: %v", err)
	}
	p := &Proxy{ln: ln, target: target, links: map[*link]struct{}{}}
	p.wg.Go(p.accept)
	tb.Cleanup(p.Close)
	return p
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL is Addr as a NATS client URL.
func (p *Proxy) URL() string { return "nats://" + p.Addr() }

// CutAll cuts every connection open now and returns how many it cut.
func (p *Proxy) CutAll() int {
	p.mu.Lock()
	p.armed = nil
	p.mu.Unlock()
	return p.cutAll()
}

func (p *Proxy) cutAll() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.cut()
	}
	return len(links)
}

// CutOnNext arms the proxy to cut every connection as soon as data from the
// target holds marker (e.g. "HMSG " for a message delivered to a client):
// that data is dropped with the connections, as if the network failed while
// it was on its way. The channel closes when the cut is made; CutAll or
// another CutOnNext disarms it.
func (p *Proxy) CutOnNext(marker []byte) <-chan struct{} {
	t := &trap{marker: marker, sprung: make(chan struct{})}
	p.mu.Lock()
	p.armed = t
	p.mu.Unlock()
	return t.sprung
}

// spring cuts every connection if the trap set is still armed and data holds
// its marker; it reports whether it did.
func (p *Proxy) spring(data []byte) bool {
	p.mu.Lock()
	t := p.armed
	if t == nil || !bytes.Contains(data, t.marker) {
		p.mu.Unlock()
		return false
	}
	p.armed = nil
	p.mu.Unlock()
	p.cutAll()
	close(t.sprung)
	return true
}

// Close stops accepting, cuts every connection and waits for the forwarding
// to end.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.CutAll()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		target, err := net.Dial("tcp", p.target)
		if err != nil {
			// The target is down: the client sees its connection refused,
			// as it would without the proxy.
			_ = client.Close()
			continue
		}
		l := &link{client: client, target: target}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.cut()
			return
		}
		p.links[l] = struct{}{}
		p.mu.Unlock()
		var pipes sync.WaitGroup
		pipes.Go(func() { p.pipe(l, client, target) })
		pipes.Go(func() {
			_, _ = io.Copy(target, client)
			l.cut()
		})
		p.wg.Go(func() {
			pipes.Wait()
			p.mu.Lock()
			delete(p.links, l)
			p.mu.Unlock()
		})
	}
}

// pipe copies what the target sends to the client until either side fails,
// springing an armed trap on the way, then cuts the link, so a side that
// goes away takes the other with it.
func (p *Proxy) pipe(l *link, client, target net.Conn) {
	defer l.cut()
	buf := make([]byte, 32<<10)
	for {
		n, err := target.Read(buf)
		if n > 0 {
			if p.spring(buf[:n]) {
				return
			}
			if _, err := client.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
