package tidelog.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Base64;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A client's private key file as netty reads it: PEM PKCS#8 ({@code BEGIN PRIVATE KEY}). The
 * Python client (BoringSSL) also reads OpenSSL's traditional forms, SEC1 ({@code BEGIN EC
 * PRIVATE KEY}, as {@code openssl ecparam -genkey} writes it) and PKCS#1 ({@code BEGIN RSA
 * PRIVATE KEY}); so that the same {@code tlsKey} works for both readers, those are wrapped here
 * into PKCS#8, which holds the same key with its algorithm named. Nothing is written to disk.
 *
 * <p>An encrypted key is refused with the command that decrypts it: a task has no one to ask for
 * a passphrase. Any other text is handed to netty as it is (its error then names the problem).
 */
final class PemKeys {
  private static final Pattern BLOCK =
      Pattern.compile("-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \\1-----", Pattern.DOTALL);
  /** AlgorithmIdentifier of RSA keys: rsaEncryption (1.2.840.113549.1.1.1), NULL parameters. */
  private static final byte[] RSA_ALGORITHM = {
    0x30, 0x0d, 0x06, 0x09, 0x2a, (byte) 0x86, 0x48, (byte) 0x86, (byte) 0xf7, 0x0d, 0x01, 0x01,
    0x01, 0x05, 0x00
  };
  /** The OID id-ecPublicKey (1.2.840.10045.2.1), whose parameters name the curve. */
  private static final byte[] EC_PUBLIC_KEY = {
    0x06, 0x07, 0x2a, (byte) 0x86, 0x48, (byte) 0xce, 0x3d, 0x02, 0x01
  };
  private static final byte[] VERSION_0 = {0x02, 0x01, 0x00};

  private PemKeys() {}

  /** The key in {@code path} as PEM PKCS#8; {@code path}'s bytes when they are that already. */
  static byte[] pkcs8(Path path) {
    byte[] given;
    try {
      given = Files.readAllBytes(path);
    } catch (IOException error) {
      throw new UncheckedIOException("cannot read option 'tlsKey' " + path + ": " + error, error);
    }
    String text = new String(given, StandardCharsets.US_ASCII);
    Matcher block = BLOCK.matcher(text);
    while (block.find()) {
      String kind = block.group(1);
      String body = block.group(2);
      if (kind.equals("ENCRYPTED PRIVATE KEY") || body.contains("Proc-Type: 4,ENCRYPTED")) {
        throw new IllegalArgumentException(
            "option 'tlsKey' " + path + " is encrypted; give the key unencrypted, e.g. made by"
                + " `openssl pkey -in " + path + " -out key.pem` (readable by the job only)");
      }
      if (kind.equals("RSA PRIVATE KEY")) {
        byte[] pkcs1 = Base64.getMimeDecoder().decode(body.trim());
        return pem(sequence(VERSION_0, RSA_ALGORITHM, tlv(0x04, pkcs1)));
      }
      if (kind.equals("EC PRIVATE KEY")) {
        byte[] sec1 = Base64.getMimeDecoder().decode(body.trim());
        byte[] curve = curveOf(sec1, path);
        return pem(sequence(VERSION_0, sequence(EC_PUBLIC_KEY, curve), tlv(0x04, sec1)));
      }
      // Other blocks (EC PARAMETERS before an EC key, PRIVATE KEY) are not converted.
    }
    return given;
  }

  /** The named curve's OID (its whole TLV) in a SEC1 ECPrivateKey's {@code [0]} parameters. */
  private static byte[] curveOf(byte[] sec1, Path path) {
    int[] outer = header(sec1, 0);
    if (sec1[0] != 0x30) {
      throw notSec1(path);
    }
    int at = outer[0];
    int end = at + outer[1];
    while (at < end) {
      int[] field = header(sec1, at);
      int tag = sec1[at] & 0xff;
      if (tag == 0xa0) {
        int oid = field[0];
        int[] inner = header(sec1, oid);
        if (sec1[oid] != 0x06) {
          break; // explicit curve parameters: netty reads none of those either
        }
        return Arrays.copyOfRange(sec1, oid, inner[0] + inner[1]);
      }
      at = field[0] + field[1];
    }
    throw notSec1(path);
  }

  private static IllegalArgumentException notSec1(Path path) {
    return new IllegalArgumentException(
        "option 'tlsKey' " + path + ": not an EC private key on a named curve; give it as"
            + " PKCS#8 (`openssl pkcs8 -topk8 -nocrypt -in KEY -out key.pem`)");
  }

  /** {content offset, content length} of the DER element at {@code at}. */
  private static int[] header(byte[] der, int at) {
    int first = der[at + 1] & 0xff;
    if (first < 0x80) {
      return new int[] {at + 2, first};
    }
    int bytes = first & 0x7f;
    int length = 0;
    for (int i = 0; i < bytes; i++) {
      length = (length << 8) | (der[at + 2 + i] & 0xff);
    }
    return new int[] {at + 2 + bytes, length};
  }

  private static byte[] sequence(byte[]... parts) {
    int size = 0;
    for (byte[] part : parts) {
      size += part.length;
    }
    byte[] content = new byte[size];
    int at = 0;
    for (byte[] part : parts) {
      System.arraycopy(part, 0, content, at, part.length);
      at += part.length;
    }
    return tlv(0x30, content);
  }

  private static byte[] tlv(int tag, byte[] content) {
    int n = content.length;
    byte[] length;
    if (n < 0x80) {
      length = new byte[] {(byte) n};
    } else if (n < 0x100) {
      length = new byte[] {(byte) 0x81, (byte) n};
    } else if (n < 0x10000) {
      length = new byte[] {(byte) 0x82, (byte) (n >> 8), (byte) n};
    } else {
      length = new byte[] {(byte) 0x83, (byte) (n >> 16), (byte) (n >> 8), (byte) n};
    }
    byte[] out = new byte[1 + length.length + n];
    out[0] = (byte) tag;
    System.arraycopy(length, 0, out, 1, length.length);
    System.arraycopy(content, 0, out, 1 + length.length, n);
    return out;
  }

  private static byte[] pem(byte[] der) {
    String body = Base64.getMimeEncoder(64, new byte[] {'\n'}).encodeToString(der);
    return ("-----BEGIN PRIVATE KEY-----\n" + body + "\n-----END PRIVATE KEY-----\n")
        .getBytes(StandardCharsets.US_ASCII);
  }
}
