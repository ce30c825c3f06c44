# Perl's Net::Stomp (Debian: libnet-stomp-perl) against Curb, direct or through `curb router`.
# Usage: perl perl_net_stomp.pl HOST PORT DESTINATION COUNT PREFETCH
# Sends COUNT receipted messages, consumes them with client-individual acks and a
# prefetch, NACKs the first and ACKs its redelivery, then prints one JSON line (see
# tests/test_clients.py). Net::Stomp sends whatever CONNECT headers it is given, so it
# asks for 1.2; its ack and nack name the frame's message-id (STOMP 1.0's way), so the
# 1.2 `id` header (the MESSAGE's ack header) is passed beside it.
use strict;
use warnings;
use JSON::PP;
use Net::Stomp;

my ($host, $port, $destination, $count, $prefetch) = @ARGV;
my %result = (client => "Net::Stomp $Net::Stomp::VERSION", sent => [], acked => [],
              nacked => undef, redelivered => undef, errors => []);

sub expect_frame {
    my ($stomp, $command) = @_;
    my $frame = $stomp->receive_frame({ timeout => 10 });
    die "no frame within 10 s while waiting for $command\n" unless $frame;
    if ($frame->command ne $command) {
        push @{ $result{errors} }, $frame->command . " " . encode_json($frame->headers) . " " . ($frame->body // "");
        die "got " . $frame->command . " instead of $command\n";
    }
    return $frame;
}

eval {
    my $stomp = Net::Stomp->new({ hostname => $host, port => $port, reconnect_attempts => 1 });
    my $connected = $stomp->connect({ 'accept-version' => '1.2', host => 'localhost' });
    die "CONNECT failed\n" unless $connected && $connected->command eq 'CONNECTED';
    $result{version} = $connected->headers->{version};
    for my $n (0 .. $count - 1) {
        my $body = "perl-$n";
        $stomp->send({ destination => $destination, body => $body, receipt => "r$n", 'content-type' => 'text/plain' });
        push @{ $result{sent} }, $body if expect_frame($stomp, 'RECEIPT')->headers->{'receipt-id'} eq "r$n";
    }
    $stomp->subscribe({ destination => $destination, id => 's1', ack => 'client-individual',
                        'prefetch-count' => $prefetch });
    my %seen;
    while (@{ $result{acked} } < $count) {
        my $message = expect_frame($stomp, 'MESSAGE');
        my $body = $message->body;
        my $ack_id = $message->headers->{ack};
        if (!defined $result{nacked}) {
            $result{nacked} = $body;
            $stomp->nack({ frame => $message, id => $ack_id });
            next;
        }
        if (($message->headers->{redelivered} // '') eq 'true') {
            if ($body eq $result{nacked} && !defined $result{redelivered}) {
                $result{redelivered} = $body;
            } else {
                push @{ $result{errors} }, "unexpected redelivery of $body";
            }
        }
        push @{ $result{errors} }, "$body delivered twice" if $seen{$body}++;
        $stomp->ack({ frame => $message, id => $ack_id });
        push @{ $result{acked} }, $body;
    }
    $stomp->send_frame(Net::Stomp::Frame->new({ command => 'DISCONNECT', headers => { receipt => 'bye' } }));
    my $bye = expect_frame($stomp, 'RECEIPT');
    push @{ $result{errors} }, "RECEIPT for DISCONNECT names " . $bye->headers->{'receipt-id'}
        unless $bye->headers->{'receipt-id'} eq 'bye';
    1;
} or push @{ $result{errors} }, "$@";
print encode_json(\%result), "\n";
