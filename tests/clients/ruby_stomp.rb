# The Ruby `stomp` gem (Debian: ruby-stomp) against Curb, direct or through `curb router`.
# Usage: ruby ruby_stomp.rb HOST PORT DESTINATION COUNT PREFETCH
# Sends COUNT receipted messages, consumes them with client-individual acks and a
# prefetch, NACKs the first and ACKs its redelivery, then prints one JSON line (see
# tests/test_clients.py). The gem speaks STOMP 1.0 to 1.2; it is asked for 1.2.
require "json"
require "stomp"

host, port, destination, count, prefetch = ARGV
count = Integer(count)
result = { "client" => "ruby-stomp #{Stomp::Version::STRING}", "sent" => [], "acked" => [],
           "nacked" => nil, "redelivered" => nil, "errors" => [] }

def expect(conn, command, result)
  frame = conn.receive
  raise "connection closed while waiting for #{command}" if frame.nil?
  if frame.command != command
    result["errors"] << "#{frame.command} #{frame.headers.inspect} #{frame.body}"
    raise "got #{frame.command} instead of #{command}"
  end
  frame
end

begin
  conn = Stomp::Connection.new(
    hosts: [{ login: "", passcode: "", host: host, port: Integer(port), ssl: false }],
    reliable: false,
    connect_timeout: 10,
    connect_headers: { "accept-version" => "1.2", "host" => "localhost" },
  )
  raise "CONNECT failed: #{conn.connection_frame.inspect}" if conn.connection_frame.command != "CONNECTED"
  result["version"] = conn.protocol
  count.times do |n|
    body = "ruby-#{n}"
    conn.publish(destination, body, { "receipt" => "r#{n}", "content-type" => "text/plain" })
    result["sent"] << body if expect(conn, "RECEIPT", result).headers["receipt-id"] == "r#{n}"
  end
  conn.subscribe(destination, { "ack" => "client-individual", "prefetch-count" => prefetch }, "s1")
  while result["acked"].length < count
    message = expect(conn, "MESSAGE", result)
    body = message.body
    if result["nacked"].nil?
      result["nacked"] = body
      conn.nack(message.headers["ack"])
      next
    end
    if message.headers["redelivered"] == "true"
      if body == result["nacked"] && result["redelivered"].nil?
        result["redelivered"] = body
      else
        result["errors"] << "unexpected redelivery of #{body}"
      end
    end
    result["errors"] << "#{body} delivered twice" if result["acked"].include?(body)
    conn.ack(message.headers["ack"])
    result["acked"] << body
  end
  conn.disconnect({ "receipt" => "bye" })
  if conn.disconnect_receipt.nil? || conn.disconnect_receipt.headers["receipt-id"] != "bye"
    result["errors"] << "no RECEIPT for DISCONNECT: #{conn.disconnect_receipt.inspect}"
  end
rescue StandardError => e
  result["errors"] << "#{e.class}: #{e.message}"
end
puts JSON.generate(result)
