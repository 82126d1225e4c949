package media

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

// ObjectStore is a Store in a JetStream Object Store bucket, which every API
// replica connected to the JetStream server or cluster shares; it is
// replicated as the bucket's stream is.
//
// An object's meta message is its record: its time is the image's last save,
// and every change to it (a save of bytes already stored, a removal) is
// published on the condition that it is still the last one, so that a save
// and a removal racing each other in two replicas cannot both win. A removed
// image's chunks stay for ReaderGrace, so that a download begun before the
// removal reads it whole; a later Remove purges them.
type ObjectStore struct {
	obs     jetstream.ObjectStore
	js      jetstream.JetStream
	stream  jetstream.Stream
	bucket  string
	tempDir string
	grace   time.Duration
	now     func() time.Time
	// locks make the saves of one key in this process take turns: a Put
	// replacing another's object would purge chunks a reader may be on.
	locks [256]sync.Mutex
}

var _ Store = (*ObjectStore)(nil)

// ObjectStoreConfig tunes an ObjectStore; the zero value works.
type ObjectStoreConfig struct {
	// Bucket is the Object Store's name (default DefaultBucket).
	Bucket string
	// Replicas is how many servers keep the bucket (default 1).
	Replicas int
	// TempDir holds uploads larger than what is kept in memory until they
	// are checked (default os.TempDir()).
	TempDir string
	// ReaderGrace is how long a removed image's bytes stay for readers that
	// opened it before (default ten minutes).
	ReaderGrace time.Duration
	// Now is the clock that ReaderGrace is measured by (default time.Now).
	Now func() time.Time
}

// DefaultBucket is ObjectStoreConfig.Bucket's default.
const DefaultBucket = "FEED_MEDIA"

// NewObjectStore returns the store in cfg.Bucket, creating the bucket (file
// storage) if missing and setting its replicas.
func NewObjectStore(ctx context.Context, js jetstream.JetStream, cfg ObjectStoreConfig) (*ObjectStore, error) {
	if cfg.Bucket == "" {
		cfg.Bucket = DefaultBucket
	}
	if cfg.TempDir == "" {
		cfg.TempDir = os.TempDir()
	}
	if cfg.ReaderGrace <= 0 {
		cfg.ReaderGrace = 10 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	obs, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      cfg.Bucket,
		Description: "Images uploaded with posts, by content hash.",
		Storage:     jetstream.FileStorage,
		Replicas:    max(cfg.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("media object store %s: %w", cfg.Bucket, err)
	}
	stream, err := js.Stream(ctx, "OBJ_"+cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("media object store %s: %w", cfg.Bucket, err)
	}
	return &ObjectStore{obs: obs, js: js, stream: stream, bucket: cfg.Bucket, tempDir: cfg.TempDir, grace: cfg.ReaderGrace, now: cfg.Now}, nil
}

// Save implements Store. The upload is received as the other stores receive
// it (its key is its hash, known once it is read) and then streamed into the
// bucket in chunks; bytes stored already are only marked saved again.
func (o *ObjectStore) Save(ctx context.Context, r io.Reader, maxSize int64) (Image, error) {
	up, img, _, err := receive(ctx, r, maxSize, 0, o.tempDir)
	if err != nil {
		return Image{}, err
	}
	defer up.release()
	mu := &o.locks[up.sum[0]]
	mu.Lock()
	defer mu.Unlock()
	// A bucket between leaders (an election takes seconds) is waited out, as
	// appends are; the upload is kept until then, so it is sent again whole.
	ctx, cancel := context.WithTimeout(ctx, saveRetry)
	defer cancel()
	backoff := 100 * time.Millisecond
	for {
		err := o.save(ctx, up, img)
		if err == nil {
			return img, nil
		}
		if !errors.Is(err, domain.ErrUnavailable) {
			return Image{}, err
		}
		select {
		case <-ctx.Done():
			return Image{}, err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// saveRetry bounds how long a save waits for a bucket to be writable.
const saveRetry = 10 * time.Second

func (o *ObjectStore) save(ctx context.Context, up *upload, img Image) error {
	for {
		meta, info, err := o.meta(ctx, img.Key)
		if err != nil {
			return fmt.Errorf("save image %s: %w", img.Key, unavailable(err))
		}
		if info != nil && (!info.Deleted || info.Chunks > 0) {
			// Stored, or removed with its chunks still there: published
			// again, it is saved now.
			info.Deleted = false
			err = o.publish(ctx, info, meta.Sequence)
			if errors.Is(err, errChanged) {
				continue
			}
			if err != nil {
				return fmt.Errorf("save image %s: %w", img.Key, unavailable(err))
			}
			return nil
		}
		_, err = o.obs.Put(ctx, jetstream.ObjectMeta{Name: img.Key}, io.NewSectionReader(up.content(), 0, up.size))
		if err != nil {
			return fmt.Errorf("save image %s: %w", img.Key, unavailable(err))
		}
		return nil
	}
}

// unavailable marks the errors of a bucket that cannot be reached or has
// no leader as domain.ErrUnavailable (503, retry), keeping the original.
func unavailable(err error) error {
	if errors.Is(err, domain.ErrUnavailable) {
		return err
	}
	if c := events.Classify(err); errors.Is(c, domain.ErrUnavailable) {
		return c
	}
	return err
}

// Sync implements Store: nothing to do, since the server acknowledged every
// chunk and the meta message of each Save before it returned, and JetStream
// acknowledges a message once it is stored under the server's sync policy
// (on a cluster, by a quorum of the bucket's replicas).
func (o *ObjectStore) Sync(ctx context.Context) error { return ctx.Err() }

// Open implements Store, streaming the object's chunks as they are read.
func (o *ObjectStore) Open(ctx context.Context, key string) (io.ReadCloser, Image, error) {
	fm, err := checkKey(ctx, key)
	if err != nil {
		return nil, Image{}, err
	}
	res, err := o.obs.Get(ctx, key)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, Image{}, fmt.Errorf("image %s: %w", key, domain.ErrNotFound)
	}
	if err != nil {
		return nil, Image{}, fmt.Errorf("open image %s: %w", key, unavailable(err))
	}
	info, err := res.Info()
	if err != nil {
		_ = res.Close()
		return nil, Image{}, fmt.Errorf("open image %s: %w", key, err)
	}
	return res, Image{Key: key, ContentType: fm.contentType, Size: int64(info.Size)}, nil
}

// Images implements Collectable; Saved is the time the server stored the
// object's meta message, which a Save of the same bytes publishes again.
func (o *ObjectStore) Images(ctx context.Context, fn func(Stored) error) error {
	return o.each(ctx, true, func(info *jetstream.ObjectInfo) error {
		return fn(Stored{Key: info.Name, Size: int64(info.Size), Saved: info.ModTime})
	})
}

// each calls fn with the meta of every object whose name is a key, removed
// ones too unless live.
func (o *ObjectStore) each(ctx context.Context, live bool, fn func(*jetstream.ObjectInfo) error) error {
	var opts []jetstream.WatchOpt
	if live {
		opts = append(opts, jetstream.IgnoreDeletes())
	}
	w, err := o.obs.Watch(ctx, opts...)
	if err != nil {
		return fmt.Errorf("list images: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case info := <-w.Updates():
			if info == nil {
				return nil
			}
			if _, ok := parseKey(info.Name); !ok {
				continue
			}
			if err := fn(info); err != nil {
				return err
			}
		case <-ctx.Done():
			return fmt.Errorf("list images: %w", ctx.Err())
		}
	}
}

// Remove implements Collectable. Each image last saved before cutoff is
// marked removed, on the condition that its meta is still the one read; its
// chunks are purged by a Remove at least ReaderGrace later, which also
// counts their bytes.
func (o *ObjectStore) Remove(ctx context.Context, keys []string, cutoff time.Time) (Reclaimed, error) {
	var r Reclaimed
	for _, key := range keys {
		if _, ok := parseKey(key); !ok {
			continue
		}
		removed, err := o.remove(ctx, key, cutoff)
		if err != nil {
			return r, fmt.Errorf("remove image %s: %w", key, err)
		}
		if removed {
			r.Images++
		}
	}
	n, err := o.purge(ctx, o.now().Add(-o.grace))
	r.Bytes += n
	return r, err
}

func (o *ObjectStore) remove(ctx context.Context, key string, cutoff time.Time) (bool, error) {
	for {
		meta, info, err := o.meta(ctx, key)
		if err != nil || info == nil || info.Deleted || !meta.Time.Before(cutoff) {
			return false, err
		}
		info.Deleted = true // its Chunks say they are still to purge
		err = o.publish(ctx, info, meta.Sequence)
		if errors.Is(err, errChanged) {
			continue // saved again meanwhile, or removed by another replica
		}
		return err == nil, err
	}
}

// purge deletes the chunks of images removed before cutoff, then their meta.
func (o *ObjectStore) purge(ctx context.Context, cutoff time.Time) (int64, error) {
	var removed []string
	err := o.each(ctx, false, func(info *jetstream.ObjectInfo) error {
		if info.Deleted && info.ModTime.Before(cutoff) {
			removed = append(removed, info.Name)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("purge removed images: %w", err)
	}
	var freed int64
	for _, key := range removed {
		meta, info, err := o.meta(ctx, key)
		if err != nil {
			return freed, fmt.Errorf("purge removed image %s: %w", key, err)
		}
		if info == nil || !info.Deleted || !meta.Time.Before(cutoff) {
			continue
		}
		seq := meta.Sequence
		if info.Chunks > 0 {
			// Marked gone first, so that no Save takes the image back
			// while its chunks go.
			size := int64(info.Size)
			info.Size, info.Chunks, info.Digest = 0, 0, ""
			err = o.publish(ctx, info, seq)
			if errors.Is(err, errChanged) {
				continue
			}
			if err != nil {
				return freed, fmt.Errorf("purge removed image %s: %w", key, err)
			}
			if seq, err = o.lastSequence(ctx, key); err != nil {
				return freed, fmt.Errorf("purge removed image %s: %w", key, err)
			}
			freed += size
		}
		if err := o.stream.Purge(ctx, jetstream.WithPurgeSubject(o.chunkSubject(info.NUID))); err != nil {
			return freed, fmt.Errorf("purge removed image %s: %w", key, err)
		}
		// Up to the marker only: a Save since has published after it.
		if err := o.stream.Purge(ctx, jetstream.WithPurgeSubject(o.metaSubject(key)), jetstream.WithPurgeSequence(seq+1)); err != nil {
			return freed, fmt.Errorf("purge removed image %s: %w", key, err)
		}
	}
	return freed, nil
}

// errChanged is a conditional publish finding another meta message last.
var errChanged = errors.New("changed meanwhile")

// meta returns key's last meta message and what it says, or nil for a key
// never stored.
func (o *ObjectStore) meta(ctx context.Context, key string) (*jetstream.RawStreamMsg, *jetstream.ObjectInfo, error) {
	m, err := o.stream.GetLastMsgForSubject(ctx, o.metaSubject(key))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var info jetstream.ObjectInfo
	if err := json.Unmarshal(m.Data, &info); err != nil {
		return nil, nil, fmt.Errorf("meta of %s: %w", key, err)
	}
	return m, &info, nil
}

func (o *ObjectStore) lastSequence(ctx context.Context, key string) (uint64, error) {
	m, err := o.stream.GetLastMsgForSubject(ctx, o.metaSubject(key))
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}

// publish replaces the object's meta with info if the last meta message is
// still the one at seq, else returns errChanged.
func (o *ObjectStore) publish(ctx context.Context, info *jetstream.ObjectInfo, seq uint64) error {
	info.ModTime = time.Time{} // the message's time is the object's
	data, err := json.Marshal(info)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(o.metaSubject(info.Name))
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	msg.Data = data
	_, err = o.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(seq))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return errChanged
	}
	return err
}

// The bucket's subjects, as the Object Store lays them out.
func (o *ObjectStore) metaSubject(key string) string {
	return "$O." + o.bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(key))
}

func (o *ObjectStore) chunkSubject(nuid string) string { return "$O." + o.bucket + ".C." + nuid }
