// Package checkpoint keeps the DRA driver's prepared claims in a file, so
// that a restarted driver answers NodePrepareResources for a claim it
// prepared before with the same devices, knows how many jetties of each
// device are prepared, and can unprepare what an earlier process prepared.
//
// The file is JSON with a checksum over its content; it is replaced
// atomically (write to a temporary file, fsync, rename, fsync the
// directory), so a crash leaves the old or the new version, never a torn
// one. A file that cannot be read, parsed or verified, or is of another
// format version, is an error wrapping ErrUnusable that names the file and
// why; it is never overwritten: MoveAside keeps it for inspection under a
// name with the time, and the driver rebuilds what it held (package plugin).
package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Version is the format version written; a file of another version is an
// error rather than a guess.
const Version = 1

// FileName is the checkpoint's name in the plugin data directory.
const FileName = "checkpoint.json"

// ErrUnusable is wrapped by Load's errors for a checkpoint that is there but
// cannot be used: unreadable, not JSON, failing its checksum, or of another
// format version.
var ErrUnusable = errors.New("checkpoint unusable")

// MaxMovedAside is how many checkpoints MoveAside keeps for inspection; it
// removes older ones, so that a node whose checkpoint keeps breaking does
// not fill its disk.
const MaxMovedAside = 5

// movedAsideInfix and movedAsideTime make the name MoveAside gives:
// checkpoint.json.unusable-20261203T101502.000000001Z. The time, in UTC
// with nanoseconds, sorts as text.
const (
	movedAsideInfix = ".unusable-"
	movedAsideTime  = "20060102T150405.000000000Z"
)

// Claims are the prepared claims by UID.
type Claims map[string]Claim

// Claim is one prepared claim.
type Claim struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Devices   []Device `json:"devices"`
}

// Device is one prepared share of a device.
type Device struct {
	// Requests are the claim's request names the share serves.
	Requests []string `json:"requests"`
	// Pool and Device name the DRA device; URMADevice the URMA device.
	Pool       string `json:"pool"`
	Device     string `json:"device"`
	URMADevice string `json:"urmaDevice"`
	// ShareID is the allocation's share of a shared device, "" if none.
	ShareID string `json:"shareID,omitempty"`
	// Jetties is the consumed capacity.
	Jetties int64 `json:"jetties"`
	// AdminAccess marks a share of an admin-access request, which the
	// scheduler does not count as allocated; nor does the budget.
	AdminAccess bool `json:"adminAccess,omitempty"`
	// CDIDeviceIDs are what NodePrepareResources answered.
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
}

type file struct {
	Version  int             `json:"version"`
	Checksum string          `json:"checksum"`
	Claims   json.RawMessage `json:"claims"`
}

// checksum is taken over the claims' JSON as it is in the file, compacted,
// not over the claims decoded and encoded again: a field a newer driver
// added (this one ignores it when decoding) must not fail the checksum
// after a downgrade. Save writes Marshal's output, which Compact leaves
// unchanged, so files written before the checksum was taken this way verify
// too.
func checksum(claimsJSON []byte) (string, error) {
	var compact bytes.Buffer
	if err := json.Compact(&compact, claimsJSON); err != nil {
		return "", err
	}
	sum := sha256.Sum256(compact.Bytes())
	return hex.EncodeToString(sum[:]), nil
}

// tempPrefix and tempSuffix frame the names of Save's temporary files
// (os.CreateTemp puts random digits between them).
func tempPrefix(path string) string { return "." + filepath.Base(path) + "." }

const tempSuffix = ".tmp"

// RemoveLeftovers removes temporary files a Save that crashed before its
// rename left next to path: nothing else removes them. Only one driver
// runs per node, so no Save is under way when it runs at start.
func RemoveLeftovers(path string) error {
	dir, prefix := filepath.Dir(path), tempPrefix(path)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s for leftover temporary checkpoints: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || len(name) <= len(prefix)+len(tempSuffix) ||
			!strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, tempSuffix) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove leftover temporary checkpoint: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Load reads the checkpoint at path. A missing file is an error for which
// errors.Is(err, fs.ErrNotExist) holds; a file that is there but cannot be
// used, one that wraps ErrUnusable and says why.
func Load(path string) (Claims, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no checkpoint %s: %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read checkpoint %s: %w", ErrUnusable, path, err)
	}
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%w: checkpoint %s is not valid JSON: %w", ErrUnusable, path, err)
	}
	if f.Version != Version {
		return nil, fmt.Errorf("%w: checkpoint %s has version %d, this driver reads version %d", ErrUnusable, path, f.Version, Version)
	}
	var claims Claims
	if err := json.Unmarshal(f.Claims, &claims); err != nil {
		return nil, fmt.Errorf("%w: checkpoint %s is not valid JSON: %w", ErrUnusable, path, err)
	}
	if claims == nil {
		claims = Claims{}
	}
	want, err := checksum(f.Claims)
	if err != nil {
		return nil, fmt.Errorf("%w: checksum checkpoint %s: %w", ErrUnusable, path, err)
	}
	if f.Checksum != want {
		return nil, fmt.Errorf("%w: checkpoint %s fails its checksum (corrupted or edited)", ErrUnusable, path)
	}
	return claims, nil
}

// MoveAside renames the checkpoint at path to one named with the time,
// now, in the same directory (checkpoint.json.unusable-<UTC time>), and
// returns the new name; then it removes all but the newest MaxMovedAside
// of those. A failed rename returns "" and the error; a failed removal of
// an old one returns the new name and the error.
func MoveAside(path string, now time.Time) (string, error) {
	aside := path + movedAsideInfix + now.UTC().Format(movedAsideTime)
	if err := os.Rename(path, aside); err != nil {
		return "", fmt.Errorf("move the unusable checkpoint %s aside: %w", path, err)
	}
	dir, prefix := filepath.Dir(path), filepath.Base(path)+movedAsideInfix
	entries, err := os.ReadDir(dir)
	if err != nil {
		return aside, fmt.Errorf("list %s for checkpoints moved aside earlier: %w", dir, err)
	}
	var old []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			old = append(old, e.Name())
		}
	}
	slices.Sort(old) // oldest first: the names end in the time
	var errs []error
	for _, name := range old[:max(len(old)-MaxMovedAside, 0)] {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			errs = append(errs, fmt.Errorf("remove a checkpoint moved aside earlier: %w", err))
		}
	}
	return aside, errors.Join(errs...)
}

// Save replaces the checkpoint at path atomically.
func Save(path string, claims Claims) error {
	if claims == nil {
		claims = Claims{}
	}
	claimsJSON, err := json.Marshal(claims)
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	sum, err := checksum(claimsJSON)
	if err != nil {
		return fmt.Errorf("checksum checkpoint: %w", err)
	}
	data, err := json.MarshalIndent(file{Version: Version, Checksum: sum, Claims: claimsJSON}, "", "  ")
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, tempPrefix(path)+"*"+tempSuffix)
	if err != nil {
		return fmt.Errorf("write checkpoint into %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing to remove
	if err := writeAndSync(tmp, data); err != nil {
		return fmt.Errorf("write checkpoint %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("replace checkpoint %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync checkpoint directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync checkpoint directory %s: %w", dir, err)
	}
	return nil
}

// writeAndSync writes data to f, flushes it to the disk and closes f,
// returning every error met (a sync after a failed write is harmless).
func writeAndSync(f *os.File, data []byte) error {
	_, werr := f.Write(data)
	serr := f.Sync()
	return errors.Join(werr, serr, f.Close())
}
