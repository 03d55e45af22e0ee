package nodefacts

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func hardwareFacts() Facts {
	return Facts{
		DeviceCount: 2, MaxJFSDepth: 4096, MaxJFRDepth: 2048, MaxJFCDepth: 8192,
		MaxMsgSize: 1 << 31, JettiesPerDevice: 960, JettiesPerUnit: 16,
	}
}

func TestRoundTrip(t *testing.T) {
	for _, f := range []Facts{
		hardwareFacts(),
		{DeviceCount: 0},
		{DeviceCount: 0, Software: true},
		{DeviceCount: 4, Software: true, MaxJFSDepth: 1, MaxJFRDepth: 1, MaxJFCDepth: 1, MaxMsgSize: 1, JettiesPerUnit: 1},
	} {
		got, err := Parse(f.Annotations())
		if err != nil {
			t.Fatalf("Parse(%v.Annotations()): %v", f, err)
		}
		if got != f {
			t.Errorf("round trip: got %+v, want %+v", got, f)
		}
	}
}

func TestLabels(t *testing.T) {
	tests := []struct {
		name string
		f    Facts
		want map[string]string
	}{
		{"hardware", hardwareFacts(), map[string]string{LabelPresent: "true", LabelDeviceCount: "2", LabelSoftware: "false",
			LabelHostLiburma: "false", LabelSoftLiburma: "false"}},
		{"none", Facts{}, map[string]string{LabelPresent: "false", LabelDeviceCount: "0", LabelSoftware: "false",
			LabelHostLiburma: "false", LabelSoftLiburma: "false"}},
		{"software", Facts{DeviceCount: 3, Software: true, SoftLiburma: true}, map[string]string{LabelPresent: "true", LabelDeviceCount: "3", LabelSoftware: "true",
			LabelHostLiburma: "false", LabelSoftLiburma: "true"}},
		{"hardware with the host's liburma", Facts{DeviceCount: 1, HostLiburma: true}, map[string]string{LabelPresent: "true", LabelDeviceCount: "1", LabelSoftware: "false",
			LabelHostLiburma: "true", LabelSoftLiburma: "false"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.f.Labels(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Labels() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestAnnotationsWithoutDevicesOmitCapabilities(t *testing.T) {
	a := Facts{MaxJFSDepth: 7}.Annotations()
	for _, k := range []string{AnnotationMaxJFSDepth, AnnotationMaxJFRDepth, AnnotationMaxJFCDepth, AnnotationMaxMsgSize, AnnotationJettiesPerDevice, AnnotationJettiesPerUnit} {
		if _, ok := a[k]; ok {
			t.Errorf("annotation %s present on a node without devices", k)
		}
	}
	if a[AnnotationDeviceCount] != "0" {
		t.Errorf("device count = %q, want 0", a[AnnotationDeviceCount])
	}
}

func TestParseErrors(t *testing.T) {
	valid := hardwareFacts().Annotations()
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for kk, vv := range valid {
			m[kk] = vv
		}
		if v == "<delete>" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name        string
		annotations map[string]string
		wantErrIs   error
		wantInError []string
	}{
		{"nil map", nil, ErrNoFacts, nil},
		{"unrelated keys only", map[string]string{"example.com/x": "1"}, ErrNoFacts, nil},
		{"negative count", with(AnnotationDeviceCount, "-1"), nil, []string{AnnotationDeviceCount, `"-1"`}},
		{"count not a number", with(AnnotationDeviceCount, "two"), nil, []string{AnnotationDeviceCount}},
		{"count missing", with(AnnotationDeviceCount, "<delete>"), nil, []string{AnnotationDeviceCount + " is missing"}},
		{"depth overflow", with(AnnotationMaxJFSDepth, "4294967296"), nil, []string{AnnotationMaxJFSDepth}},
		{"depth zero", with(AnnotationMaxJFRDepth, "0"), nil, []string{AnnotationMaxJFRDepth + " must be positive"}},
		{"msg size missing", with(AnnotationMaxMsgSize, "<delete>"), nil, []string{AnnotationMaxMsgSize + " is missing"}},
		{"unit zero", with(AnnotationJettiesPerUnit, "0"), nil, []string{AnnotationJettiesPerUnit}},
		{"software not bool", with(AnnotationSoftware, "maybe"), nil, []string{AnnotationSoftware, "true or false"}},
		{"jfc depth hex", with(AnnotationMaxJFCDepth, "0x10"), nil, []string{AnnotationMaxJFCDepth}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.annotations)
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			if tt.wantErrIs != nil && !errors.Is(err, tt.wantErrIs) {
				t.Fatalf("error %v is not %v", err, tt.wantErrIs)
			}
			if tt.wantErrIs == nil && errors.Is(err, ErrNoFacts) {
				t.Fatalf("malformed facts reported as ErrNoFacts: %v", err)
			}
			for _, s := range tt.wantInError {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestParseReportsEveryBadKey(t *testing.T) {
	a := hardwareFacts().Annotations()
	a[AnnotationMaxJFSDepth] = "x"
	a[AnnotationMaxMsgSize] = "y"
	_, err := Parse(a)
	if err == nil || !strings.Contains(err.Error(), AnnotationMaxJFSDepth) || !strings.Contains(err.Error(), AnnotationMaxMsgSize) {
		t.Fatalf("error %v should name both bad keys", err)
	}
}

func TestParseToleratesWhitespace(t *testing.T) {
	a := hardwareFacts().Annotations()
	a[AnnotationMaxJFSDepth] = " 4096\n"
	f, err := Parse(a)
	if err != nil || f.MaxJFSDepth != 4096 {
		t.Fatalf("Parse = %+v, %v; want depth 4096", f, err)
	}
}

func TestKeysAreUnderPrefix(t *testing.T) {
	for _, k := range append(AnnotationKeys(), LabelKeys()...) {
		if !strings.HasPrefix(k, Prefix) || len(k) <= len(Prefix) {
			t.Errorf("key %q is not under %q", k, Prefix)
		}
	}
	f := hardwareFacts()
	if len(f.Annotations()) != len(AnnotationKeys()) {
		t.Errorf("Annotations() has %d keys, AnnotationKeys() %d", len(f.Annotations()), len(AnnotationKeys()))
	}
	if len(f.Labels()) != len(LabelKeys()) {
		t.Errorf("Labels() has %d keys, LabelKeys() %d", len(f.Labels()), len(LabelKeys()))
	}
}

// FuzzParse sets two keys of a hardware node's annotations: two, so that a
// node without devices can be given a malformed leftover capability.
func FuzzParse(f *testing.F) {
	for k, v := range hardwareFacts().Annotations() {
		f.Add(k, v, "", "")
	}
	f.Add(AnnotationDeviceCount, "-0", "", "")
	f.Add(AnnotationSoftware, "T", "", "")
	f.Fuzz(func(t *testing.T, key, value, key2, value2 string) {
		a := hardwareFacts().Annotations()
		a[key] = value
		a[key2] = value2
		facts, err := Parse(a)
		if _, berr := strconv.ParseBool(strings.TrimSpace(a[AnnotationSoftware])); a[AnnotationDeviceCount] == "0" && berr == nil && err != nil {
			t.Fatalf("a node without devices: Parse failed on leftover capabilities: %v", err)
		}
		if err != nil {
			return
		}
		if verr := facts.Validate(); verr != nil {
			t.Fatalf("Parse returned facts that fail Validate: %v", verr)
		}
		again, err := Parse(facts.Annotations())
		if err != nil || again != facts {
			t.Fatalf("re-parse of rendered facts: %+v, %v; want %+v", again, err, facts)
		}
	})
}

// A node without devices has no capabilities: those left over from when it
// had devices are dropped, and a malformed one (only a hand edit makes one)
// used to make the empty node's facts unreadable.
func TestParseIgnoresLeftoverCapabilitiesWhenNoDevices(t *testing.T) {
	capKeys := []string{AnnotationMaxJFSDepth, AnnotationMaxJFRDepth, AnnotationMaxJFCDepth,
		AnnotationMaxMsgSize, AnnotationJettiesPerDevice, AnnotationJettiesPerUnit}
	tests := []struct {
		name     string
		count    string
		leftover map[string]string
	}{
		{"well-formed", "0", nil},
		{"not a number", "0", map[string]string{AnnotationMaxJFSDepth: "x"}},
		{"negative", "0", map[string]string{AnnotationMaxJFRDepth: "-1"}},
		{"overflow", "0", map[string]string{AnnotationMaxJFCDepth: "4294967296"}},
		{"hex", "0", map[string]string{AnnotationMaxMsgSize: "0x10"}},
		{"empty", "0", map[string]string{AnnotationJettiesPerDevice: ""}},
		{"zero", "0", map[string]string{AnnotationJettiesPerUnit: "0"}},
		{"every key malformed", "0", func() map[string]string {
			m := map[string]string{}
			for _, k := range capKeys {
				m[k] = "stale"
			}
			return m
		}()},
		{"count with whitespace", " 0\n", map[string]string{AnnotationMaxJFSDepth: "x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := hardwareFacts().Annotations()
			a[AnnotationDeviceCount] = tt.count
			a[AnnotationSoftware] = "true"
			for k, v := range tt.leftover {
				a[k] = v
			}
			f, err := Parse(a)
			if err != nil {
				t.Fatal(err)
			}
			if want := (Facts{Software: true}); f != want {
				t.Errorf("Parse = %+v, want %+v", f, want)
			}
		})
	}
}

// Leftovers are ignored only when the count says there are no devices: a
// bad count still comes with every other bad key named.
func TestParseNamesBadCapabilitiesWithBadCount(t *testing.T) {
	a := hardwareFacts().Annotations()
	a[AnnotationDeviceCount] = "none"
	a[AnnotationMaxJFSDepth] = "x"
	_, err := Parse(a)
	if err == nil || !strings.Contains(err.Error(), AnnotationDeviceCount) || !strings.Contains(err.Error(), AnnotationMaxJFSDepth) {
		t.Fatalf("error %v should name both bad keys", err)
	}
}
