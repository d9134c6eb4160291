package content

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/mercator/mercator/failure"
)

// S3Config names a bucket of an S3-compatible service and the credential
// this control plane uses for it.
type S3Config struct {
	// Endpoint is HOST[:PORT] of the service (for AWS, s3.REGION.amazonaws.com).
	Endpoint string
	Bucket   string
	// Prefix, when set, is prepended (with a "/") to every object key.
	Prefix string
	// Region is the bucket's region; empty lets the client ask.
	Region string
	// Insecure speaks plain HTTP to Endpoint; meant for a service on
	// loopback in tests, never for a bucket across a network.
	Insecure bool
	// AccessKey and SecretKey are the control plane's own credential. They
	// sign requests and presigned URLs and never leave this process.
	AccessKey, SecretKey, SessionToken string
	// Transport carries the requests (http.DefaultTransport when nil).
	Transport http.RoundTripper
}

// S3 keeps content in a bucket of any S3-compatible service, one object per
// digest (PREFIX/sha256/DIGEST), and mints reads as presigned GETs. A node
// then reads from the bucket directly: the control plane signs, the bucket
// serves, and the bytes never pass through the control plane, which is what
// lets a fleet copy a dataset to a hundred machines at once.
//
// The credential signs each URL for one object and one lifetime; the node
// holds the signature and never the key.
type S3 struct {
	cfg    S3Config
	client *minio.Client
}

// NewS3 returns a store over the bucket. It makes no request: a bucket that
// cannot be reached is reported by the first call that needs it.
func NewS3(cfg S3Config) (*S3, error) {
	switch {
	case cfg.Endpoint == "":
		return nil, failure.Invalid("content", "an S3 content store needs endpoint=HOST[:PORT]")
	case cfg.Bucket == "":
		return nil, failure.Invalid("content", "an S3 content store needs a bucket: s3://BUCKET/…")
	case cfg.AccessKey == "" || cfg.SecretKey == "":
		return nil, failure.Invalid("content", "an S3 content store needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment")
	}
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:     credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken),
		Secure:    !cfg.Insecure,
		Region:    cfg.Region,
		Transport: cfg.Transport,
	})
	if err != nil {
		return nil, failure.Invalid("content", "S3 endpoint %q: %v", cfg.Endpoint, err)
	}
	return &S3{cfg: cfg, client: client}, nil
}

func (s *S3) key(digest string) string {
	if s.cfg.Prefix == "" {
		return "sha256/" + digest
	}
	return s.cfg.Prefix + "/sha256/" + digest
}

// Describe implements Store.
func (s *S3) Describe() string {
	return fmt.Sprintf("s3 bucket %s at %s", strings.TrimSuffix(s.cfg.Bucket+"/"+s.cfg.Prefix, "/"), s.cfg.Endpoint)
}

// Stat implements Store.
func (s *S3) Stat(ctx context.Context, digest string) (int64, error) {
	if err := checkDigest(digest); err != nil {
		return 0, err
	}
	info, err := s.client.StatObject(ctx, s.cfg.Bucket, s.key(digest), minio.StatObjectOptions{})
	if err != nil {
		return 0, s.classify(err, "stat", digest)
	}
	return info.Size, nil
}

// Put implements Store: one upload of the file (multipart above the
// client's threshold), skipped when the object is already there. The file
// is removed once the object is stored.
func (s *S3) Put(ctx context.Context, digest, path string, size int64) error {
	if err := checkDigest(digest); err != nil {
		return err
	}
	if held, err := s.Stat(ctx, digest); err == nil && held == size {
		return os.Remove(path)
	} else if err != nil && !errors.Is(err, failure.ErrNotFound) {
		return err
	}
	_, err := s.client.FPutObject(ctx, s.cfg.Bucket, s.key(digest), path, minio.PutObjectOptions{
		ContentType: "application/octet-stream",
		PartSize:    64 << 20,
	})
	if err != nil {
		return s.classify(err, "put", digest)
	}
	return os.Remove(path)
}

// ReadURL implements Store with a presigned GET. S3 bounds a presigned
// URL's life to seven days.
func (s *S3) ReadURL(ctx context.Context, digest string, ttl time.Duration) (string, time.Time, error) {
	if err := checkDigest(digest); err != nil {
		return "", time.Time{}, err
	}
	if ttl <= 0 || ttl > 7*24*time.Hour {
		return "", time.Time{}, failure.Invalid("ttl", "a presigned read lives from 1s to 7 days, not %s", ttl)
	}
	ttl = ttl.Round(time.Second)
	exp := time.Now().Add(ttl).UTC()
	u, err := s.client.PresignedGetObject(ctx, s.cfg.Bucket, s.key(digest), ttl, nil)
	if err != nil {
		return "", time.Time{}, s.classify(err, "presign", digest)
	}
	return u.String(), exp, nil
}

func (s *S3) classify(err error, op, digest string) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("content %s: %s in %s: %w", digest, op, s.Describe(), err)
	}
	resp := minio.ToErrorResponse(err)
	switch {
	case resp.Code == minio.NoSuchKey || resp.StatusCode == http.StatusNotFound && resp.Code != minio.NoSuchBucket:
		return failure.NotFound("content", digest)
	case resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized:
		return failure.Unavailable("content %s: %s in %s was refused (%s): check the control plane's S3 credential", digest, op, s.Describe(), resp.Code)
	}
	return failure.Unavailable("content %s: %s in %s: %v", digest, op, s.Describe(), err)
}
