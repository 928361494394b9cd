/*
 * An ACPI PCI hotplug guest without ACPI's interpreter: it does what the DSDT's methods do
 * (devices/acpi/pci_hotplug.rs) by hand. Each round waits for a slot in the controller's
 * PCIU register (read clears it), prints the new function's id from its config space and
 * the PIC's request register (the GED's line raised), then waits for PCID (an eject
 * request). Even rounds eject at once (B0EJ), as a guest whose driver let go. Odd rounds
 * first drive the device (virtio status ACKNOWLEDGE|DRIVER: "in use") and ignore the
 * first request; at the second they reset the device and eject it. After each eject the
 * slot must read all-ones (the VMM took the device away).
 * Params: 0 = rounds (default 2). Ends with 0, or 1 if nothing came within ~2 minutes.
 */
#include "runtime.h"
#include "pci.h"
#include "virtio.h"

#define HP_PORT 0x620
#define PCIU 0
#define PCID 4
#define B0EJ 8

static u32 pic_irr(void) { return inb(0x20) | (u32)inb(0xa0) << 8; }

/* The controller's register `reg` once it is not 0 (reading clears it), or 0. */
static u32 wait_bits(u16 reg) {
	for (u64 i = 0; i < 120000; i++) {
		u32 v = inl(HP_PORT + reg);
		if (v) return v;
		idle_wait(1000);
	}
	return 0;
}

static u32 lowest(u32 bits) {
	u32 s = 0;
	while (!(bits & 1u << s)) s++;
	return s;
}

static int gone(u32 fn) {
	for (u32 i = 0; i < 120000; i++) {
		if (pci_read(PCI_PIO, fn, 0, 4) == 0xffffffff) return 1;
		idle_wait(1000);
	}
	return 0;
}

int main(void) {
	u64 rounds = param(0, 2);
	enter_user();
	print("hotplug: waiting\n");
	for (u64 r = 0; r < rounds; r++) {
		u32 up = wait_bits(PCIU);
		if (!up) {
			print("hotplug: round %lu: nothing plugged\n", r);
			return 1;
		}
		u32 slot = lowest(up), fn = slot << 3, id = pci_read(PCI_PIO, fn, 0, 4);
		print("hotplug: round %lu: slot %u plugged, id %08x, class %06x, irr %x\n", r, slot, id,
		      pci_read(PCI_PIO, fn, 8, 4) >> 8, pic_irr());
		struct vdev d;
		int driven = r % 2 == 1 && vdev_find_nth(&d, (id >> 16) - 0x1040, 0) == 0 && d.fn == fn;
		if (driven) {
			vdev_set_status(&d, 0);
			vdev_set_status(&d, 1 | 2);
			print("hotplug: round %lu: driving it, status %u\n", r, vdev_status(&d));
		}
		u32 down = wait_bits(PCID);
		print("hotplug: round %lu: eject asked for %x\n", r, down);
		if (!down) return 1;
		if (driven) {
			print("hotplug: round %lu: in use, not ejected\n", r);
			down = wait_bits(PCID);
			print("hotplug: round %lu: eject asked again for %x: letting go\n", r, down);
			vdev_set_status(&d, 0);
		}
		outl(HP_PORT + B0EJ, down);
		print("hotplug: round %lu: slot %u %s\n", r, slot, gone(fn) ? "gone" : "still there");
	}
	print("hotplug: done\n");
	return 0;
}
