// Ogg pages for Opus (RFC 7845), both ways: the page muxes the packets its WebCodecs encoder
// makes into the stream the server reads, and takes the server's pages apart into packets
// for its WebCodecs decoder. Granule positions count 48 kHz samples, as Ogg Opus requires.

const CRC_TABLE = (() => {
  // Ogg's CRC-32: polynomial 0x04c11db7, not reflected, initial value 0
  const table = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let r = i << 24;
    for (let j = 0; j < 8; j++) r = (r & 0x80000000) ? ((r << 1) ^ 0x04c11db7) : (r << 1);
    table[i] = r >>> 0;
  }
  return table;
})();

export function oggCrc(bytes) {
  let crc = 0;
  for (let i = 0; i < bytes.length; i++) {
    crc = ((crc << 8) ^ CRC_TABLE[((crc >>> 24) ^ bytes[i]) & 0xff]) >>> 0;
  }
  return crc >>> 0;
}

const HEADER_BOS = 0x02;
const HEADER_CONTINUED = 0x01;

function page(packets, { granule, serial, sequence, flags }) {
  // Each packet is laced as 255-byte segments ending in one shorter than 255.
  const lacing = [];
  for (const p of packets) {
    let n = p.length;
    while (n >= 255) { lacing.push(255); n -= 255; }
    lacing.push(n);
  }
  if (lacing.length > 255) throw new Error("too many segments for one Ogg page");
  const body = packets.reduce((n, p) => n + p.length, 0);
  const out = new Uint8Array(27 + lacing.length + body);
  const view = new DataView(out.buffer);
  out.set([0x4f, 0x67, 0x67, 0x53], 0); // "OggS"
  out[4] = 0; // stream structure version
  out[5] = flags;
  view.setBigInt64(6, BigInt(granule), true);
  view.setUint32(14, serial, true);
  view.setUint32(18, sequence, true);
  out[26] = lacing.length;
  out.set(lacing, 27);
  let at = 27 + lacing.length;
  for (const p of packets) { out.set(p, at); at += p.length; }
  view.setUint32(22, oggCrc(out), true); // computed with the CRC field still zero
  return out;
}

function ascii(text) { return new TextEncoder().encode(text); }

export function opusHead({ channels = 1, preSkip = 312, inputRate = 24000 } = {}) {
  const head = new Uint8Array(19);
  const view = new DataView(head.buffer);
  head.set(ascii("OpusHead"), 0);
  head[8] = 1; // version
  head[9] = channels;
  view.setUint16(10, preSkip, true);
  view.setUint32(12, inputRate, true);
  view.setInt16(16, 0, true); // output gain
  head[18] = 0; // channel mapping family 0: mono or stereo
  return head;
}

function opusTags(vendor) {
  const v = ascii(vendor);
  const tags = new Uint8Array(8 + 4 + v.length + 4);
  const view = new DataView(tags.buffer);
  tags.set(ascii("OpusTags"), 0);
  view.setUint32(8, v.length, true);
  tags.set(v, 12);
  view.setUint32(12 + v.length, 0, true); // no user comments
  return tags;
}

// Packets in, pages out. The two header pages come first; then a page every
// `packetsPerPage` packets (the reference web client streams 2 frames of 20 ms per page).
export class OggOpusWriter {
  constructor({ head, packetsPerPage = 2, vendor = "personaplex-edge" } = {}) {
    this.serial = (Math.random() * 0xffffffff) >>> 0;
    this.sequence = 0;
    this.head = head || opusHead();
    this.preSkip = new DataView(this.head.buffer, this.head.byteOffset).getUint16(10, true);
    this.granule = this.preSkip;
    this.packetsPerPage = packetsPerPage;
    this.pending = [];
    this.vendor = vendor;
  }

  headers() {
    return [
      page([this.head], { granule: 0, serial: this.serial, sequence: this.sequence++,
                          flags: HEADER_BOS }),
      page([opusTags(this.vendor)], { granule: 0, serial: this.serial,
                                       sequence: this.sequence++, flags: 0 }),
    ];
  }

  // samples48k: the packet's duration in 48 kHz samples (960 for 20 ms)
  add(packet, samples48k) {
    this.pending.push(packet);
    this.granule += samples48k;
    if (this.pending.length < this.packetsPerPage) return null;
    return this.flush();
  }

  flush() {
    if (!this.pending.length) return null;
    const out = page(this.pending, { granule: this.granule, serial: this.serial,
                                     sequence: this.sequence++, flags: 0 });
    this.pending = [];
    return out;
  }
}

// Bytes in (pages, possibly split across messages), packets out.
export class OggReader {
  constructor() {
    this.buffer = new Uint8Array(0);
    this.partial = []; // pieces of a packet that continues on the next page
  }

  push(bytes) {
    const joined = new Uint8Array(this.buffer.length + bytes.length);
    joined.set(this.buffer, 0);
    joined.set(bytes, this.buffer.length);
    const packets = [];
    let at = 0;
    while (joined.length - at >= 27) {
      if (joined[at] !== 0x4f || joined[at + 1] !== 0x67 || joined[at + 2] !== 0x67 ||
          joined[at + 3] !== 0x53) throw new Error("not an Ogg stream");
      const segments = joined[at + 26];
      const headerLength = 27 + segments;
      if (joined.length - at < headerLength) break;
      const lacing = joined.subarray(at + 27, at + headerLength);
      const bodyLength = lacing.reduce((n, x) => n + x, 0);
      if (joined.length - at < headerLength + bodyLength) break;
      if (!(joined[at + 5] & HEADER_CONTINUED)) this.partial = [];
      let p = at + headerLength;
      for (const size of lacing) {
        this.partial.push(joined.subarray(p, p + size));
        p += size;
        if (size < 255) {
          const length = this.partial.reduce((n, x) => n + x.length, 0);
          const packet = new Uint8Array(length);
          let q = 0;
          for (const piece of this.partial) { packet.set(piece, q); q += piece.length; }
          packets.push(packet);
          this.partial = [];
        }
      }
      this.partial = this.partial.map((x) => x.slice());
      at += headerLength + bodyLength;
    }
    this.buffer = joined.slice(at);
    return packets;
  }
}

export function isHeaderPacket(packet) {
  if (packet.length < 8) return false;
  const magic = new TextDecoder().decode(packet.subarray(0, 8));
  return magic === "OpusHead" || magic === "OpusTags";
}
