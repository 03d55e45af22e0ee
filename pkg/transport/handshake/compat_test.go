package handshake

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// brpcHelloDescriptor is brpc's UrmaHello (src/brpc/urma/urma_handshake.proto)
// as a descriptor, so a real protobuf implementation can check our hand
// encoding against brpc's schema: proto2, every field required, no field 100.
func brpcHelloDescriptor(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	req := descriptorpb.FieldDescriptorProto_LABEL_REQUIRED.Enum()
	u32 := descriptorpb.FieldDescriptorProto_TYPE_UINT32.Enum()
	u64 := descriptorpb.FieldDescriptorProto_TYPE_UINT64.Enum()
	byt := descriptorpb.FieldDescriptorProto_TYPE_BYTES.Enum()
	field := func(name string, num int32, typ *descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(num), Label: req, Type: typ}
	}
	fd := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("brpc/urma/urma_handshake.proto"),
		Package: proto.String("brpc.urma"),
		Syntax:  proto.String("proto2"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("UrmaHello"),
			Field: []*descriptorpb.FieldDescriptorProto{
				field("buffer_size", 1, u32), field("recv_buffer_cnt", 2, u32),
				field("jetty_id", 3, u32), field("eid", 4, byt), field("uasid", 5, u32),
				field("tp_type", 6, u32), field("seg_eid", 7, byt), field("seg_uasid", 8, u32),
				field("seg_va", 9, u64), field("seg_len", 10, u64), field("seg_token_id", 11, u32),
			},
		}},
	}
	file, err := protodesc.NewFile(fd, nil)
	if err != nil {
		t.Fatalf("build brpc descriptor: %v", err)
	}
	return file.Messages().ByName("UrmaHello")
}

func TestV3BodyMatchesBrpcSchema(t *testing.T) {
	md := brpcHelloDescriptor(t)
	h := sampleHello()
	h.Token, h.HasToken = 0x1234, true
	h.SQSize = 512
	h.CloseMarker = true

	// Ours -> brpc: a strict proto2 parser (required fields enforced) reads
	// every field, and keeps our token as an unknown field.
	msg := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(MarshalV3Body(nil, h), msg); err != nil {
		t.Fatalf("brpc schema cannot parse our body: %v", err)
	}
	get := func(name string) protoreflect.Value { return msg.Get(md.Fields().ByName(protoreflect.Name(name))) }
	checks := []struct {
		name string
		got  any
		want any
	}{
		{"buffer_size", get("buffer_size").Uint(), uint64(h.BufferSize)},
		{"recv_buffer_cnt", get("recv_buffer_cnt").Uint(), uint64(h.RecvBufferCnt)},
		{"jetty_id", get("jetty_id").Uint(), uint64(h.JettyID)},
		{"eid", string(get("eid").Bytes()), string(h.EID[:])},
		{"uasid", get("uasid").Uint(), uint64(h.UASID)},
		{"tp_type", get("tp_type").Uint(), uint64(h.TPType)},
		{"seg_eid", string(get("seg_eid").Bytes()), string(h.SegEID[:])},
		{"seg_uasid", get("seg_uasid").Uint(), uint64(h.SegUASID)},
		{"seg_va", get("seg_va").Uint(), h.SegVA},
		{"seg_len", get("seg_len").Uint(), h.SegLen},
		{"seg_token_id", get("seg_token_id").Uint(), uint64(h.SegTokenID)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("field %s: brpc reads %v, want %v", c.name, c.got, c.want)
		}
	}
	if len(msg.GetUnknown()) == 0 {
		t.Error("our token and sq_size fields should survive as unknown fields in brpc's schema")
	}

	// brpc -> ours: what protobuf marshals from brpc's schema, we parse.
	msg.SetUnknown(nil)
	wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := UnmarshalV3Body(wire)
	if err != nil {
		t.Fatalf("parse brpc-schema body: %v", err)
	}
	want := h
	want.Token, want.HasToken, want.SQSize, want.CloseMarker = 0, false, 0, false
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// TestProtoFileMatchesCodec keeps urma_handshake.proto, the documentation of
// our v3 schema, in step with the field numbers the codec writes.
func TestProtoFileMatchesCodec(t *testing.T) {
	src, err := os.ReadFile("urma_handshake.proto")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^\s*(required|optional)\s+\w+\s+(\w+)\s*=\s*(\d+)\s*;`)
	inFile := map[string]int{}
	labels := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		n, _ := strconv.Atoi(m[3])
		inFile[m[2]] = n
		labels[m[2]] = m[1]
	}
	want := map[string]int{"token": int(fieldToken), "sq_size": int(fieldSQSize), "close_marker": int(fieldCloseMarker), "boot_id": int(fieldBootID), "socket_eid": int(fieldSocketEID)}
	for _, f := range requiredFields {
		want[f.name] = int(f.num)
		if labels[f.name] != "required" {
			t.Errorf("field %s should be required in the .proto, as in brpc's", f.name)
		}
	}
	if len(inFile) != len(want) {
		t.Errorf(".proto has %d fields, codec %d", len(inFile), len(want))
	}
	for name, num := range want {
		if inFile[name] != num {
			t.Errorf("field %s: .proto says %d, codec uses %d", name, inFile[name], num)
		}
	}
	if fieldToken <= fieldSegTokenID || fieldSQSize <= fieldSegTokenID || fieldCloseMarker <= fieldSegTokenID || fieldBootID <= fieldSegTokenID || fieldSocketEID <= fieldSegTokenID {
		t.Error("our fields must not reuse a brpc field number")
	}
}
